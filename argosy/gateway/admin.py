"""Admin endpoints, behind the admin key (`admin_key_hash`). Open without one only on a gateway that
listens on loopback alone and has no keys at all; beyond loopback they need the admin key whatever
else is set (`--insecure` included), and so do the replica URLs (/metrics/targets, /dashboard/data).

GET /admin/upstreams                      every model's upstreams and their state
POST /admin/upstreams {model, url[, revision]}   add one (how an autoscaler registers replicas)
DELETE /admin/upstreams {model, url}      remove one
GET /admin/keys                           key names, models, limits, budget, expiry and usage (never hashes)
POST /admin/keys {name[, models, rpm, tpm, priority, budget_usd, expires_at, residency]}  create; the key is in this
                                          answer only
POST /admin/keys/NAME/rotate              a new secret for the key (same limits, same usage); the old one stops
DELETE /admin/keys/NAME                   revoke
With `gateway.redis_url`, key changes reach every gateway on that Redis before the answer (key_sync.py).
The local admin credential of `argosy serve` / `argosy gateway` (local_admin.py) is accepted from loopback
clients, whatever else is set: the operator on this machine is never locked out.
GET /admin/fleet                          with `argosy serve`: nodes, replicas, states, autoscaler decisions
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import time
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from argosy.config import KeyConfig
from argosy.gateway.asgi import Receive, Scope, Send, bearer, header, respond_json
from argosy.gateway.errors import GatewayError, bad_request, not_found
from argosy.gateway.keys import KeyRecord
from argosy.gateway.limits import parse_json, read_body

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


def _loopback_client(scope: Scope) -> bool:
    client = scope.get("client")
    try:
        return bool(client) and ipaddress.ip_address(client[0].split("%")[0]).is_loopback
    except ValueError:
        return False


def _local_admin(gw: Gateway, scope: Scope, key: str | None) -> bool:
    """The local admin credential (local_admin.py), from a loopback client."""
    local = gw.local_admin_digest
    return bool(key) and local is not None and _loopback_client(scope) \
        and hmac.compare_digest(hashlib.sha256(key.encode()).digest(), local)


def _host_of(netloc: str) -> str:
    """The host of `host[:port]` (`[::1]:8000` included)."""
    if netloc.startswith("["):
        return netloc[1:netloc.find("]")] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def refuse_web_pages(scope: Scope, refused: str = "admin endpoints without an admin key answer only this "
                                                  "machine's own clients", code: str = "admin_cross_origin") -> None:
    """Open endpoints take no credential, so a web page the operator visits could call them: a form or fetch()
    with a simple content type needs no CORS preflight (POST /admin/upstreams then sends the model's prompts to
    the page's server; POST /v1/completions spends the machine's model on the page's behalf), and a name the
    page rebinds to 127.0.0.1 makes it same-origin, its answers readable. A browser names the page in Origin,
    and the name it connected to in Host: both must be this machine's loopback. (Ollama refuses other origins
    by default for the same reason.)"""
    host = header(scope, b"host")
    origin = header(scope, b"origin")
    host_s = host.decode("latin-1").strip() if host is not None else None
    if host_s is not None and not is_loopback(_host_of(host_s)):
        why = f"the Host header ({host_s!r}) is not a loopback address"
    elif origin is not None and (origin.decode("latin-1").partition("://")[2] or "null") != (host_s or ""):
        why = f"the request comes from the web page {origin.decode('latin-1')!r}"
    else:
        return
    raise GatewayError(403, f"{refused}: {why}", "permission_error", code)


async def require_admin(gw: Gateway, scope: Scope) -> None:
    """The admin key (or the local admin credential from loopback), unless the gateway listens on loopback
    alone and has no keys at all."""
    key = bearer(scope)
    if _local_admin(gw, scope, key):
        return
    if gw.keys.admin_hash is None:
        if gw.keys.keyless and gw.loopback_only:
            refuse_web_pages(scope)
            return
        why = "the gateway listens beyond loopback" if not gw.loopback_only else "the fleet has API keys"
        raise GatewayError(403, f"admin endpoints need an admin key: {why}. On this machine `argosy keys` and "
                           "`argosy status` use the local admin credential that `argosy serve` writes; elsewhere "
                           "set one (argosy keys add admin --admin --config FILE) and restart",
                           "permission_error", "admin_disabled")
    if key and await gw.auth.is_admin(scope):  # keyed SHA-256 (or an old scrypt hash, off the loop); 429
        return                                    # for an address with many failed attempts
    raise GatewayError(401, "an admin key is required", "authentication_error", "invalid_admin_key")


async def require_admin_beyond_loopback(gw: Gateway, scope: Scope) -> None:
    """For what publishes replica URLs and key names (/metrics/targets, /dashboard/data): open to this machine's
    own clients on loopback, else admin. Not to a web page that rebound its name to 127.0.0.1: its fetch() is
    same-origin then, a GET without Origin, but its Host is the page's name."""
    if not gw.loopback_only:
        await require_admin(gw, scope)
    else:
        refuse_web_pages(scope, "on loopback this route answers only this machine's own clients, not web pages",
                         "cross_origin")


async def admin_body(gw: Gateway, scope: Scope, receive: Receive) -> dict[str, Any]:
    """Authorize, then the JSON body ({} when empty)."""
    await require_admin(gw, scope)
    body = await read_body(scope, receive, gw.fleet.gateway.max_body_bytes)
    req = parse_json(body) if body else {}
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
    keys = []
    for k in sorted(gw.keys.by_id.values(), key=lambda k: k.name):
        usage = await gw.limiter.get_usage(k.name)
        usage["spend_usd"] = usage.pop("spend_micro_usd") / 1e6
        keys.append({**k.public(), "usage": usage})
    await respond_json(send, 200, {"keys": keys})


async def create_key(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    req = await admin_body(gw, scope, receive)
    name = req.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request("give the new key a 'name'", "name")
    if gw.keys.named(name) is not None:
        raise bad_request(f"a key named {name!r} exists already: rotate it, or revoke it first", "name")
    rec = _new_record(name, req)
    unknown = sorted(set(rec.models or ()) - set(gw.models))
    if unknown:  # a key for a model this gateway does not have could use nothing: a typo, most likely
        raise bad_request(f"models: no model {', '.join(map(repr, unknown))} in this fleet "
                          f"({', '.join(sorted(gw.models)) or 'none'})", "models")
    await _issue(gw, send, rec)


async def rotate_key(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    """POST /admin/keys/NAME/rotate."""
    await admin_body(gw, scope, receive)
    name, _, verb = scope["path"].removeprefix("/admin/keys/").rpartition("/")
    rec = gw.keys.named(name) if verb == "rotate" else None
    if rec is None:
        raise not_found(f"no key named {name!r}" if verb == "rotate" else f"no admin route POST {scope['path']}")
    await _issue(gw, send, dataclasses.replace(rec, source="admin"), rotated=rec)


async def revoke_key(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await admin_body(gw, scope, receive)
    name = scope["path"].removeprefix("/admin/keys/")
    if gw.keys.named(name) is None:  # the error format, as rotate's: `argosy keys` had printed {"ok": false}
        raise not_found(f"no key named {name!r}")
    if gw.key_sync is not None:
        await gw.key_sync.revoke(name)
    else:
        gw.keys.remove(name)
    await respond_json(send, 200, {"ok": True, "name": name, "shared": gw.key_sync is not None,
                                   "keys_left": len(gw.keys.by_id),  # 0: every request a 401 until a key is added
                                   "in_fleet_file": any(k.name == name for k in gw.fleet.keys)})


def _new_record(name: str, req: dict[str, Any]) -> KeyRecord:
    fields = {k: req.get(k) for k in ("models", "rpm", "tpm", "budget_usd", "expires_at", "residency")}
    fields["priority"] = req.get("priority", "interactive")
    try:  # the fleet file's rules for a key
        checked = KeyConfig(name=name, hash="scrypt:x", **{k: v for k, v in fields.items() if v is not None})
    except ValidationError as e:
        err = e.errors()[0]
        raise bad_request(f"{'.'.join(map(str, err['loc']))}: {err['msg']}", str(err["loc"][0])) from None
    rec = KeyRecord.from_config(checked)
    rec.source, rec.created_at = "admin", time.time()
    return rec


async def _issue(gw: Gateway, send: Send, rec: KeyRecord, rotated: KeyRecord | None = None) -> None:
    """A fresh secret for rec: in the store (every gateway on the Redis), and in this answer only."""
    key, rec.hash = gw.keys.mint()  # keyed with this gateway's pepper
    if gw.key_sync is not None:
        await gw.key_sync.put(rec)
    else:
        if rotated is not None:
            gw.keys.remove(rotated.name)
        gw.keys.add(rec)
    await respond_json(send, 200, {**rec.public(), "key": key, "hash": rec.hash, "shared": gw.key_sync is not None})


async def fleet_status(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await admin_body(gw, scope, receive)
    if gw.fleet_view is None:
        raise not_found("no fleet here: GET /admin/fleet answers under `argosy serve`")
    await respond_json(send, 200, gw.fleet_view.status())  # `argosy status`
