"""The gateway's route table: method and path -> handler, over the OpenAI endpoints (proxied, app.py's
Gateway.handle), /v1/models, /health, /metrics, the dashboard and /admin/*. Every route here is in
/openapi.json (gateway/openapi.py; tests/test_openapi.py checks both ways).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from argosy.gateway import admin, dashboard, endpoints, rollout_api
from argosy.gateway.asgi import Receive, Scope, Send
from argosy.gateway.components import ENCODER_PATHS, TOKENIZER_PATHS
from argosy.gateway.errors import method_not_allowed, not_found
from argosy.gateway.regions import endpoints as region_endpoints

if TYPE_CHECKING:
    from argosy.gateway.app import Gateway

PROXIED = ("/v1/chat/completions", "/v1/completions", *sorted(ENCODER_PATHS), *sorted(TOKENIZER_PATHS))
Handler = Callable[["Gateway", Scope, Receive, Send], Awaitable[None]]


async def proxied(gateway: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await gateway.proxied(scope, receive, send)


ROUTES: dict[tuple[str, str], Handler] = {
    **{("POST", path): proxied for path in PROXIED},
    ("GET", "/health"): endpoints.health,
    ("GET", "/openapi.json"): endpoints.openapi,  # every route here is in it (gateway/openapi.py)
    ("HEAD", "/health"): endpoints.health,
    ("GET", "/version"): endpoints.version,
    ("GET", "/v1/models"): endpoints.list_models,
    ("GET", "/metrics"): endpoints.metrics,
    ("GET", "/metrics/targets"): endpoints.metrics_targets,
    ("GET", "/dashboard"): dashboard.page,
    ("GET", "/dashboard/"): dashboard.page,
    ("GET", "/dashboard/data"): dashboard.data,
    ("GET", "/admin/upstreams"): admin.list_upstreams,
    ("POST", "/admin/upstreams"): admin.add_upstream,
    ("DELETE", "/admin/upstreams"): admin.remove_upstream,
    ("GET", "/admin/keys"): admin.list_keys,
    ("POST", "/admin/keys"): admin.create_key,
    ("GET", "/admin/fleet"): admin.fleet_status,
    ("POST", "/regions/exchange"): region_endpoints.exchange,
    ("GET", "/admin/regions"): region_endpoints.status,
    ("POST", "/admin/preempt"): region_endpoints.preempt,
    ("GET", "/admin/rollouts"): rollout_api.list_rollouts,
    ("GET", "/admin/shadow"): rollout_api.shadow_report,
}
PREFIX_ROUTES: list[tuple[str, str, Handler]] = [  # a path under a folder: the handler reads the rest
    ("GET", "/v1/models/", endpoints.get_model),
    ("DELETE", "/admin/keys/", admin.revoke_key),
    ("POST", "/admin/keys/", admin.rotate_key),
    ("GET", "/admin/rollouts/", rollout_api.get_rollout),
    ("POST", "/admin/rollouts/", rollout_api.command),
    ("GET", "/admin/shadow/", rollout_api.shadow_report),
    ("GET", "/dashboard/", dashboard.static_file),
]


def handler_for(method: str, path: str) -> Handler:
    """The handler for a request; a 404 for an unknown path, a 405 for a known path and another method."""
    handler = ROUTES.get((method, path))
    if handler is not None:
        return handler
    for m, prefix, h in PREFIX_ROUTES:
        if m == method and path.startswith(prefix) and len(path) > len(prefix):
            return h
    allowed = sorted({m for m, p in ROUTES if p == path} |
                     {m for m, prefix, _ in PREFIX_ROUTES if path.startswith(prefix) and len(path) > len(prefix)})
    if allowed:
        raise method_not_allowed(method, path, allowed)
    raise not_found(f"no route {method} {path}")
