"""The regions' endpoints on a gateway:

POST /regions/exchange   another region's gateway: its signed state in, ours out (401 unless signed)
GET /admin/regions       this gateway's view: every region per model (measured RTT, load, capacity,
                         outlier state and share), behind the admin key
POST /admin/preempt {"node", "deadline_s"}   with `argosy serve`: a preemption notice for a (spot) node: its
                         replicas drain and are replaced elsewhere (fleet/preemption.py)
POST /admin/preempt {"node", "restore": true}   the node is back and takes replicas again
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from argosy.gateway.admin import require_admin
from argosy.gateway.asgi import JSON, Receive, Scope, Send, read_body, respond, respond_json
from argosy.gateway.errors import bad_request, not_found

if TYPE_CHECKING:
    from argosy.gateway.app import Gateway


def _not_regional() -> Exception:
    return not_found("this gateway is not part of a multi-region fleet (regions and gateway.region / --region)")


async def exchange(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    if gw.region_exchange is None:
        raise _not_regional()
    body = await read_body(receive)
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    out, signed = gw.region_exchange.answer(headers, body)
    await respond(send, 200, out, headers=[(b"content-type", JSON),
                                           *((k.encode(), v.encode()) for k, v in signed.items())])


async def status(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    require_admin(gw, scope)
    if gw.regions is None:
        raise _not_regional()
    ex = gw.region_exchange
    await respond_json(send, 200, {
        "region": gw.regions.name, "exchange_rounds": ex.rounds if ex else 0,
        "exchange_errors": dict(ex.last_error) if ex else {},
        "models": {name: [u.snapshot() for u in mr.candidates] for name, mr in gw.regions.models.items()}})


async def preempt(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    require_admin(gw, scope)
    fleet = gw.fleet_view
    if fleet is None or not hasattr(fleet, "preempt"):
        raise not_found("no fleet controller runs beside this gateway (argosy serve) to take a preemption notice")
    try:
        body = json.loads(await read_body(receive) or b"{}")
    except ValueError:
        raise bad_request("the body must be JSON: {\"node\": NAME, \"deadline_s\": SECONDS}") from None
    node, deadline = (body.get("node"), body.get("deadline_s", 120.0)) if isinstance(body, dict) else (None, None)
    if not isinstance(node, str) or not node:
        raise bad_request("give the node: {\"node\": NAME, \"deadline_s\": SECONDS}", "node")
    if isinstance(deadline, bool) or not isinstance(deadline, int | float) or not math.isfinite(deadline) \
            or deadline <= 0:
        raise bad_request("deadline_s must be a number of seconds > 0", "deadline_s")
    try:
        out = fleet.preempt(node, float(deadline), source="admin", restore=bool(body.get("restore")))
    except KeyError as e:
        raise not_found(str(e.args[0])) from None
    await respond_json(send, 200, out)
