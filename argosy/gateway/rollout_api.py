"""The rollout endpoints, behind the admin key (the rules of argosy.gateway.admin). Under `argosy serve`
only: the controller runs rollouts (argosy.fleet.rollout); a gateway alone answers 404.

GET  /admin/rollouts                       every managed model: stable revision, split, rollout, history
GET  /admin/rollouts/MODEL                 one model's
POST /admin/rollouts/MODEL/start           {"to": REVISION, "strategy": "canary"|"blue-green"|"rolling"}
POST /admin/rollouts/MODEL/promote         {"full": false}: the next step (true: straight to 100%)
POST /admin/rollouts/MODEL/pause|resume
POST /admin/rollouts/MODEL/abort           {"reason": "..."}
GET  /admin/shadow[/MODEL]                 shadow agreement by model, candidate revision and prompt length
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from argosy.gateway.admin import admin_body
from argosy.gateway.asgi import Receive, Scope, Send, respond_json
from argosy.gateway.errors import not_found

if TYPE_CHECKING:
    from argosy.gateway.app import Gateway

VERBS = ("start", "promote", "pause", "resume", "abort")


def _fleet(gw: Gateway):
    if gw.fleet_view is None:
        raise not_found("no fleet here: rollouts run under `argosy serve`")
    return gw.fleet_view


async def list_rollouts(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await admin_body(gw, scope, receive)
    await respond_json(send, 200, {"models": _fleet(gw).rollout_status()})


async def get_rollout(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await admin_body(gw, scope, receive)
    model = scope["path"].removeprefix("/admin/rollouts/")
    if "/" in model:
        raise not_found(f"no route GET {scope['path']} (GET /admin/rollouts/MODEL)")
    await respond_json(send, 200, _fleet(gw).rollout_status(model)[0])


async def command(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    body = await admin_body(gw, scope, receive)
    model, _, verb = scope["path"].removeprefix("/admin/rollouts/").rpartition("/")
    if not model or verb not in VERBS:
        raise not_found(f"no route POST {scope['path']} (POST /admin/rollouts/MODEL/{{{','.join(VERBS)}}})")
    await respond_json(send, 200, await _fleet(gw).rollout_command(model, verb, body))


async def shadow_report(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await admin_body(gw, scope, receive)
    model = scope["path"].removeprefix("/admin/shadow").removeprefix("/") or None
    if model is not None and model not in gw.models:
        raise not_found(f"the model {model!r} does not exist")
    await respond_json(send, 200, {"models": gw.shadower.pairs.report(model)})
