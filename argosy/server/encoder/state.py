"""What the encoder endpoints share: the engine thread, admission, tokenization off the event loop,
and errors in the endpoint's own shape (OpenAI's on /v1/*, TEI's on /embed and /rerank).

Status codes follow TEI where one applies: 413 for more inputs than a request may carry (and, on TEI's
routes, an input over the length limit), 424 for an endpoint the model's kind does not serve; an input
over the limit on an OpenAI route is OpenAI's 400. Overload is 503 with Retry-After, as the LLM server.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import Response

from argosy.encoder.checkpoint import EMBED
from argosy.encoder.errors import BatchTooLargeError, EncoderInputError, InputTooLongError
from argosy.server.encoder.engine_thread import AsyncEncoder, EncoderStopped
from argosy.server.errors import APIError

KIND_ENDPOINTS = {"embed": ("/v1/embeddings", "/embed", "/v1/rerank", "/rerank"),
                  "rerank": ("/v1/rerank", "/rerank")}
TEI_TYPES = {400: "Empty", 413: "Validation", 422: "Tokenizer", 424: "Backend", 429: "Overloaded",
             503: "Unhealthy", 500: "Backend"}


class TEIError(Exception):
    """An error on TEI's routes: `{"error": message, "error_type": type}` with TEI's status codes."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers

    def response(self) -> Response:
        body = json.dumps({"error": self.message, "error_type": TEI_TYPES.get(self.status, "Validation")})
        return Response(body, status_code=self.status, headers=self.headers, media_type="application/json")

    @classmethod
    def from_api(cls, e: APIError) -> TEIError:
        return cls(e.status, e.message, e.headers)


async def tei_error_handler(request, exc: Exception) -> Response:
    assert isinstance(exc, TEIError)
    return exc.response()


def wrong_kind(kind: str, served: str, path: str) -> APIError:
    serves = ", ".join(KIND_ENDPOINTS.get(kind, ()))
    what = "an embedding model" if kind == EMBED else "a cross-encoder reranker"
    return APIError(424, f"The model `{served}` is {what} (kind {kind}); it does not serve {path}. "
                    f"It serves: {serves}.", param="model", code="wrong_model_kind")


def input_error(e: EncoderInputError, openai_route: bool) -> APIError:
    if isinstance(e, BatchTooLargeError):
        return APIError(413, str(e), param=e.param, code="too_many_inputs")
    if isinstance(e, InputTooLongError):
        return APIError(400 if openai_route else 413, str(e), param=e.param, code="context_length_exceeded")
    return APIError(400, str(e), param=e.param, code="invalid_input")


@dataclass
class EncoderState:
    served_model_name: str
    engine: AsyncEncoder
    metrics: Any
    max_queue: int
    max_body_bytes: int
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def core(self) -> Any:
        """The EncoderEngine (its kind, limits and tokenizer), once loaded."""
        return self.engine.engine

    def check_ready(self) -> None:
        if self.engine.failed is not None or not self.engine.alive():
            raise APIError(503, "The engine is not running.", code="engine_dead")
        if not self.engine.ready:
            raise APIError(503, "The model is still loading.", code="not_ready", headers={"Retry-After": "5"})

    def check_kind(self, path: str) -> None:
        kind = self.core.kind
        if path not in KIND_ENDPOINTS[kind]:
            raise wrong_kind(kind, self.served_model_name, path)

    def admit(self, num_inputs: int, param: str) -> None:
        limit = self.core.config.max_client_batch_size
        if num_inputs > limit:
            raise input_error(BatchTooLargeError(num_inputs, limit, param), True)
        if self.engine.num_waiting() >= self.max_queue:
            raise APIError.overloaded(f"The server is overloaded ({self.max_queue} requests waiting); retry later.")

    async def tokenize(self, fn, *args, openai_route: bool = True) -> Any:
        """Runs a tokenizer call on the thread pool; its input errors become the route's 400/413."""
        try:
            return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
        except EncoderInputError as e:
            raise input_error(e, openai_route) from None

    async def run(self, inputs: list, arrival: float, openai_route: bool = True) -> Any:
        request_id = uuid.uuid4().hex
        try:
            out = await self.engine.run(request_id, inputs, arrival)
        except EncoderInputError as e:
            raise input_error(e, openai_route) from None
        except EncoderStopped as e:
            raise APIError(500, str(e), code="engine_error") from None
        self.metrics.on_finished(out)
        return out


def truncation(body: dict[str, Any], limit: int) -> tuple[int, bool, str]:
    """(max tokens, truncate, direction) from `truncate` (TEI), `truncate_prompt_tokens` (vLLM: -1 is the
    model's limit) and `truncation_direction` (TEI: right or left); without them an input over the limit
    is an error, as in OpenAI's API."""
    truncate = body.get("truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise APIError.bad_request("'truncate' must be a boolean.", "truncate")
    max_len, cut = limit, bool(truncate)
    tpt = body.get("truncate_prompt_tokens")
    if tpt is not None:
        if isinstance(tpt, bool) or not isinstance(tpt, int) or tpt == 0 or tpt < -1:
            raise APIError.bad_request("'truncate_prompt_tokens' must be -1 (the model's limit) or a positive "
                                       "integer.", "truncate_prompt_tokens")
        if tpt > limit:
            raise APIError.bad_request(f"'truncate_prompt_tokens' ({tpt}) is over this model's limit of {limit} "
                                       "tokens.", "truncate_prompt_tokens")
        max_len, cut = (limit if tpt == -1 else tpt), True
    direction = body.get("truncation_direction", "right")
    if not isinstance(direction, str) or direction.lower() not in ("right", "left"):
        raise APIError.bad_request("'truncation_direction' must be right or left.", "truncation_direction")
    return max_len, cut, direction.lower()
