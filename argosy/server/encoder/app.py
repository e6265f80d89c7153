"""The encoder replica's Starlette app: embeddings and rerank endpoints, models, health, metrics.

`argosy engine --model DIR` builds this app instead of the LLM server's when DIR holds an encoder
checkpoint (BertModel or BertForSequenceClassification); the routes a generative model would serve
answer 424 (TEI's status for the wrong kind of model) with a message naming what this one serves.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from argosy.server.encoder.embeddings import create_embeddings, tei_embed
from argosy.server.encoder.engine_thread import AsyncEncoder
from argosy.server.encoder.metrics import EncoderMetrics
from argosy.server.encoder.rerank import create_rerank, tei_rerank
from argosy.server.encoder.state import EncoderState, TEIError, tei_error_handler, wrong_kind
from argosy.server.errors import APIError, api_error_handler, http_error_handler, server_error_handler
from argosy.server.state import json_response

GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")


def _state(request: Request) -> EncoderState:
    return request.app.state.argosy


def _model_card(state: EncoderState) -> dict[str, Any]:
    card: dict[str, Any] = {"id": state.served_model_name, "object": "model", "created": state.created,
                            "owned_by": "argosy", "root": state.served_model_name, "parent": None}
    if state.engine.ready:
        core = state.core
        card.update(max_model_len=core.max_model_len, kind=core.kind, dimensions=core.dimensions)
    return card


async def list_models(request: Request) -> Response:
    return json_response({"object": "list", "data": [_model_card(_state(request))]})


async def get_model(request: Request) -> Response:
    state = _state(request)
    if request.path_params["model"] != state.served_model_name:
        raise APIError(404, f"The model `{request.path_params['model']}` does not exist.", param="model",
                       code="model_not_found")
    return json_response(_model_card(state))


async def info(request: Request) -> Response:
    """TEI's /info: what the server runs and its limits."""
    state = _state(request)
    state.check_ready()
    core = state.core
    return json_response({"model_id": state.served_model_name, "model_type": core.kind,
                          "model_dtype": str(core.dtype).removeprefix("torch."), "max_input_length": core.max_model_len,
                          "max_batch_tokens": core.max_num_batched_tokens,
                          "max_client_batch_size": core.config.max_client_batch_size,
                          "max_concurrent_requests": state.max_queue, "dimensions": core.dimensions})


async def health(request: Request) -> Response:
    state = _state(request)
    return json_response({"status": "ok"} if state.engine.alive() else {"status": "dead"},
                         status=200 if state.engine.alive() else 503)


async def ready(request: Request) -> Response:
    state = _state(request)
    if state.engine.ready and state.engine.alive():
        return json_response({"status": "ready", "model": state.served_model_name})
    response = json_response({"status": "dead" if state.engine.failed else "loading"}, status=503)
    response.headers["Retry-After"] = "5"
    return response


async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def not_generative(request: Request) -> Response:
    state = _state(request)
    state.check_ready()
    raise wrong_kind(state.core.kind, state.served_model_name, request.url.path)


def build_encoder_app(served_model_name: str, make_engine: Callable[[], Any], *, max_queue: int, max_body_bytes: int,
                      on_ready: Callable[[], None] = lambda: None,
                      on_failed: Callable[[BaseException], None] = lambda exc: None) -> Starlette:
    """The server for one encoder; `make_engine()` runs in the engine thread when the app starts."""
    engine = AsyncEncoder(make_engine)
    state = EncoderState(served_model_name, engine, EncoderMetrics(served_model_name, engine.queue), max_queue,
                         max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine.start(on_ready, on_failed)
        try:
            yield
        finally:
            await engine.stop()

    routes = [
        Route("/v1/embeddings", create_embeddings, methods=["POST"]),
        Route("/embed", tei_embed, methods=["POST"]),
        Route("/v1/rerank", create_rerank, methods=["POST"]),
        Route("/rerank", tei_rerank, methods=["POST"]),
        *[Route(path, not_generative, methods=["POST"]) for path in GENERATION_ROUTES],
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/info", info, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    handlers: dict[Any, Any] = {APIError: api_error_handler, TEIError: tei_error_handler,
                                HTTPException: http_error_handler, Exception: server_error_handler}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.argosy = state
    return app
