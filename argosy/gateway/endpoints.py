"""The gateway's own small endpoints: /health, /v1/models (and /v1/models/{model}), /metrics, /metrics/targets
and /openapi.json."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from argosy import __version__
from argosy.gateway.admin import require_admin_beyond_loopback
from argosy.gateway.asgi import PROMETHEUS_TEXT, Receive, Scope, Send, respond, respond_json
from argosy.gateway.errors import GatewayError
from argosy.observe.targets import http_sd

if TYPE_CHECKING:
    from argosy.gateway.app import Gateway


async def health(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await respond(send, 200, b'{"status":"ok"}')


async def version(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    """{"version": ...}: vLLM's /version, open as /health."""
    await respond_json(send, 200, {"version": __version__})


async def list_models(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await gw.authenticate(scope)
    data = await gw.model_cards.cards(gw.models, gw.session)  # max_model_len, revision, kind (model_cards.py)
    await respond_json(send, 200, {"object": "list", "data": data})


async def get_model(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    """GET /v1/models/{model}: OpenAI's retrieve (`client.models.retrieve`), the model's /v1/models card."""
    await gw.authenticate(scope)
    name = scope["path"][len("/v1/models/"):]  # a model name may hold slashes (org/name)
    rt = gw.models.get(name)
    if rt is None:
        raise GatewayError(404, f"the model {name!r} does not exist", "not_found_error", "model_not_found", "model")
    (card,) = await gw.model_cards.cards({name: rt}, gw.session)
    await respond_json(send, 200, card)


async def openapi(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    from argosy.gateway.openapi import document

    await respond_json(send, 200, document(list(gw.models)))


async def metrics(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await respond(send, 200, gw.m.render(), PROMETHEUS_TEXT)


async def metrics_targets(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await require_admin_beyond_loopback(gw, scope)  # replica URLs: a way around the gateway's keys and limits
    await respond(send, 200, http_sd(replica_targets(gw)))


def replica_targets(gw: Gateway) -> list[dict[str, Any]]:
    """(url, model, replica id, state) rows: the controller's replicas first, then the routing sets."""
    rows: dict[str, dict[str, Any]] = {}
    if gw.fleet_view is not None:
        for row in gw.fleet_view.targets():
            rows[row["url"]] = row
    for name, rt in gw.models.items():
        for u in rt.upstreams():
            rows.setdefault(u.url, {"url": u.url, "model": name, "replica": "", "state": u.state,
                                    "pooled": False})
    return list(rows.values())
