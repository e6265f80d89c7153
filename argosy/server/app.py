"""The Starlette app: routes, error handlers, and the engine thread's lifetime (lifespan)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from argosy import __version__
from argosy.observe.engine_requests import EngineRequestContext
from argosy.server.async_engine import AsyncEngine
from argosy.server.auth import RequireAPIKey
from argosy.server.chat import create_chat_completion
from argosy.server.completions import create_completion
from argosy.server.errors import APIError, api_error_handler, http_error_handler, server_error_handler
from argosy.server.metrics import ServerMetrics
from argosy.server.openapi import document
from argosy.server.state import ServerState, json_response
from argosy.server.streaming import KeepRawSend
from argosy.server.tokenize import detokenize, tokenize


def _model_card(state: ServerState) -> dict[str, Any]:
    """vLLM's model card (root: the checkpoint; max_model_len once loaded), plus the revision served and the
    kind of model (generate: completions and chat)."""
    card: dict[str, Any] = {"id": state.served_model_name, "object": "model", "created": state.created,
                            "owned_by": "argosy", "root": state.root or state.served_model_name, "parent": None,
                            "max_model_len": state.engine.max_model_len if state.engine.ready else None,
                            "revision": state.revision, "kind": "generate"}
    return card


async def list_models(request: Request) -> Response:
    state: ServerState = request.app.state.argosy
    return json_response({"object": "list", "data": [_model_card(state)]})


async def get_model(request: Request) -> Response:
    state: ServerState = request.app.state.argosy
    model = request.path_params["model"]
    if model != state.served_model_name:
        raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")
    return json_response(_model_card(state))


async def health(request: Request) -> Response:
    """Liveness: 200 while the process and its engine thread run (loading included)."""
    state: ServerState = request.app.state.argosy
    if not state.engine.alive():
        return json_response({"status": "dead"}, status=503)
    return json_response({"status": "ok"})


async def version(request: Request) -> Response:
    """{"version": ...}: vLLM's /version (open, as /health)."""
    return json_response({"version": __version__})


async def ready(request: Request) -> Response:
    """Readiness: 200 once the model is loaded and the warm-up request ran, else 503."""
    state: ServerState = request.app.state.argosy
    if state.engine.ready and state.engine.alive():
        return json_response({"status": "ready", "model": state.served_model_name})
    response = json_response({"status": "dead" if state.engine.failed else "loading"}, status=503)
    response.headers["Retry-After"] = "5"
    return response


async def openapi(request: Request) -> Response:
    state: ServerState = request.app.state.argosy
    max_model_len = state.engine.max_model_len if state.engine.ready else 1 << 20  # unknown until loaded
    return json_response(document(state.served_model_name, max_model_len))


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.argosy
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


def build_app(
    served_model_name: str,
    make_engine: Callable[[], Any],
    *,
    max_queue: int,
    max_body_bytes: int,
    on_ready: Callable[[], None] = lambda: None,
    on_failed: Callable[[BaseException], None] = lambda exc: None,
    tracing: Any = None,
    root: str | None = None,
    revision: str | None = None,
    api_key: str | None = None,
    telemetry: Any = None,
) -> ASGIApp:
    """The server for one engine; `make_engine()` runs in the engine thread when the app starts.
    `tracing`: an argosy.observe.tracing.Tracing, or None (no traces). `telemetry`: a
    device_telemetry.DeviceTelemetry whose series /metrics adds, or None."""
    engine = AsyncEngine(make_engine)
    server_metrics = ServerMetrics(served_model_name, engine.engine_stats, telemetry)
    engine.observer = server_metrics
    state = ServerState(served_model_name, engine, server_metrics, max_queue=max_queue, max_body_bytes=max_body_bytes,
                        root=root, revision=revision)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine.start(on_ready, on_failed)
        try:
            yield
        finally:
            await engine.stop()
            if tracing is not None:
                await asyncio.to_thread(tracing.shutdown)  # export the spans still queued

    routes = [
        Route("/v1/completions", create_completion, methods=["POST"]),
        Route("/v1/chat/completions", create_chat_completion, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),  # every route here is in it (openapi.py)
    ]
    handlers: dict[Any, Any] = {APIError: api_error_handler, HTTPException: http_error_handler,
                                Exception: server_error_handler}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.argosy = state
    # KeepRawSend outermost: streamed chunks skip EngineRequestContext's send wrapper.
    served = KeepRawSend(EngineRequestContext(app, served_model_name, tracing))
    return RequireAPIKey(served, api_key) if api_key else served  # `argosy engine --api-key`
