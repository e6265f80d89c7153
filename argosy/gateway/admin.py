"""Admin endpoints, behind the admin key (`admin_key_hash`); open only when no keys exist at all
(then the gateway is loopback-only).

GET /admin/upstreams                      every model's upstreams and their state
POST /admin/upstreams {model, url[, revision]}   add one (how an autoscaler registers replicas)
DELETE /admin/upstreams {model, url}      remove one
GET /admin/keys                           key names, models, limits and usage (never hashes)
POST /admin/keys {name[, models, rpm, tpm, priority]}  create; the key is in this answer only
DELETE /admin/keys/NAME                   revoke
GET /admin/fleet                          with `argosy serve`: nodes, replicas, states, autoscaler decisions
"""

from __future__ import annotations

import hashlib
import json

from argosy.gateway.errors import GatewayError, bad_request
from argosy.gateway.keys import KeyRecord, new_key, verify


def _authorize(gw, scope) -> None:
    from argosy.gateway.app import bearer

    if gw.keys.admin_hash is None:
        if gw.keys.empty:
            return
        raise GatewayError(403, "admin endpoints are disabled: set admin_key_hash in the fleet file "
                           "(argosy keys add admin --admin --config FILE)", "permission_error", "admin_disabled")
    key = bearer(scope)
    if key:
        d = hashlib.sha256(key.encode()).digest()
        if d == getattr(gw, "_admin_digest", None) or verify(key, gw.keys.admin_hash):
            gw._admin_digest = d  # cache the verified admin key's digest: one scrypt per process
            return
    raise GatewayError(401, "an admin key is required", "authentication_error", "invalid_admin_key")


async def handle(gw, scope, receive, send, path: str, method: str) -> None:
    from argosy.gateway.app import read_body, respond

    _authorize(gw, scope)
    body = await read_body(receive)
    try:
        req = json.loads(body) if body else {}
    except ValueError:
        raise bad_request("the body must be JSON") from None
    if path == "/admin/upstreams":
        if method == "GET":
            out = {name: {rev: [u.snapshot() for u in r.upstreams] for rev, r in rt.routers.items()}
                   for name, rt in gw.models.items()}
            return await respond(send, 200, json.dumps({"models": out}).encode())
        rt = gw.models.get(req.get("model"))
        if rt is None or not isinstance(req.get("url"), str):
            raise bad_request("give an existing 'model' and an upstream 'url'", "model")
        if method == "POST":
            if not req["url"].startswith(("http://", "https://")):
                raise bad_request("the upstream url must be http(s)", "url")
            rt.add_upstream(req["url"], req.get("revision"))
            return await respond(send, 200, b'{"ok":true}')
        if method == "DELETE":
            ok = rt.remove_upstream(req["url"])
            return await respond(send, 200 if ok else 404, json.dumps({"ok": ok}).encode())
    if path == "/admin/keys":
        if method == "GET":
            keys = [{**k.public(), "usage": await gw.limiter.get_usage(k.name)} for k in gw.keys.by_id.values()]
            return await respond(send, 200, json.dumps({"keys": keys}).encode())
        if method == "POST":
            name = req.get("name")
            if not isinstance(name, str) or not name or any(k.name == name for k in gw.keys.by_id.values()):
                raise bad_request("give a new key 'name'", "name")
            key, h = new_key()
            rec = KeyRecord(name, h, req.get("models"), req.get("rpm"), req.get("tpm"),
                            req.get("priority", "interactive"))
            gw.keys.add(rec)
            return await respond(send, 200, json.dumps({**rec.public(), "key": key, "hash": h}).encode())
    if path.startswith("/admin/keys/") and method == "DELETE":
        ok = gw.keys.remove(path.rsplit("/", 1)[1])
        return await respond(send, 200 if ok else 404, json.dumps({"ok": ok}).encode())
    if path == "/admin/fleet" and method == "GET" and getattr(gw, "controller", None) is not None:
        return await respond(send, 200, json.dumps(gw.controller.status()).encode())  # `argosy status`
    raise GatewayError(404, f"no admin route {method} {path}", "not_found_error", "not_found")
