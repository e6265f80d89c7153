"""Admin endpoints, behind the admin key (`admin_key_hash`). Open without one only on a gateway that
listens on loopback alone and has no keys at all; beyond loopback they need the admin key whatever
else is set (`--insecure` included), and so do the replica URLs (/metrics/targets, /dashboard/data).

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
import ipaddress
import json
from typing import TYPE_CHECKING, Any

from argosy.gateway.asgi import Receive, Scope, Send, bearer, read_body, respond_json
from argosy.gateway.errors import GatewayError, bad_request, not_found
from argosy.gateway.keys import KeyRecord, new_key, verify

if TYPE_CHECKING:
    from argosy.gateway.app import Gateway
    from argosy.gateway.traffic import ModelRuntime


def is_loopback(host: str) -> bool:
    """Whether an address to listen on is loopback only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name, 0.0.0.0, ::, an interface's address: reachable from elsewhere


def require_admin(gw: Gateway, scope: Scope) -> None:
    """The admin key, unless the gateway listens on loopback alone and has no keys at all."""
    if gw.keys.admin_hash is None:
        if gw.keys.empty and gw.loopback_only:
            return
        why = "the gateway listens beyond loopback" if not gw.loopback_only else "the fleet has API keys"
        raise GatewayError(403, f"admin endpoints are disabled: {why} and no admin key is set (add one: "
                           "argosy keys add admin --admin --config FILE)", "permission_error", "admin_disabled")
    key = bearer(scope)
    if key:
        d = hashlib.sha256(key.encode()).digest()
        if d == gw.admin_digest or verify(key, gw.keys.admin_hash):
            gw.admin_digest = d  # cache the verified admin key's digest: one scrypt per process
            return
    raise GatewayError(401, "an admin key is required", "authentication_error", "invalid_admin_key")


def require_admin_beyond_loopback(gw: Gateway, scope: Scope) -> None:
    """For what publishes replica URLs (/metrics/targets, /dashboard/data): open on loopback, else admin."""
    if not gw.loopback_only:
        require_admin(gw, scope)


async def admin_body(gw: Gateway, scope: Scope, receive: Receive) -> dict[str, Any]:
    """Authorize, then the JSON body ({} when empty)."""
    require_admin(gw, scope)
    body = await read_body(receive)
    try:
        req = json.loads(body) if body else {}
    except ValueError:
        raise bad_request("the body must be JSON") from None
    if not isinstance(req, dict):
        raise bad_request("the body must be a JSON object")
    return req


def _model_and_url(gw: Gateway, req: dict[str, Any]) -> tuple[ModelRuntime, str]:
    rt = gw.models.get(req.get("model")) if isinstance(req.get("model"), str) else None
    if rt is None or not isinstance(req.get("url"), str):
        raise bad_request("give an existing 'model' and an upstream 'url'", "model")
    return rt, req["url"]


async def list_upstreams(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await admin_body(gw, scope, receive)
    out = {name: {rev: [u.snapshot() for u in r.upstreams] for rev, r in rt.routers.items()}
           for name, rt in gw.models.items()}
    await respond_json(send, 200, {"models": out})


async def add_upstream(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    req = await admin_body(gw, scope, receive)
    rt, url = _model_and_url(gw, req)
    if not url.startswith(("http://", "https://")):
        raise bad_request("the upstream url must be http(s)", "url")
    revision = req.get("revision")
    if revision is not None and not isinstance(revision, str):
        raise bad_request("'revision' must be a string", "revision")
    rt.add_upstream(url, revision)
    await respond_json(send, 200, {"ok": True})


async def remove_upstream(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    rt, url = _model_and_url(gw, await admin_body(gw, scope, receive))
    ok = rt.remove_upstream(url)
    await respond_json(send, 200 if ok else 404, {"ok": ok})


async def list_keys(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await admin_body(gw, scope, receive)
    keys = [{**k.public(), "usage": await gw.limiter.get_usage(k.name)} for k in gw.keys.by_id.values()]
    await respond_json(send, 200, {"keys": keys})


async def create_key(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    req = await admin_body(gw, scope, receive)
    name = req.get("name")
    if not isinstance(name, str) or not name or any(k.name == name for k in gw.keys.by_id.values()):
        raise bad_request("give a new key 'name'", "name")
    key, h = new_key()
    rec = KeyRecord(name, h, req.get("models"), req.get("rpm"), req.get("tpm"), req.get("priority", "interactive"))
    gw.keys.add(rec)
    await respond_json(send, 200, {**rec.public(), "key": key, "hash": h})


async def revoke_key(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await admin_body(gw, scope, receive)
    ok = gw.keys.remove(scope["path"].rsplit("/", 1)[1])
    await respond_json(send, 200 if ok else 404, {"ok": ok})


async def fleet_status(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await admin_body(gw, scope, receive)
    if gw.fleet_view is None:
        raise not_found("no fleet here: GET /admin/fleet answers under `argosy serve`")
    await respond_json(send, 200, gw.fleet_view.status())  # `argosy status`
