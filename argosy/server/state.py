"""What every handler shares: the engine, admission control, ids and JSON bodies."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import Response

from argosy.engine.errors import InvalidRequestError
from argosy.engine.outputs import RequestOutput
from argosy.observe.engine_requests import note_group
from argosy.server.async_engine import AsyncEngine, EngineRequest, EngineStepError, RequestGroup
from argosy.server.errors import APIError
from argosy.server.metrics import ServerMetrics
from argosy.server.protocol import Fields, check_model, read_json_body

LONG_PROMPT_CHARS = 16_384  # prompts this long are tokenized in a worker thread (ServerState.encode_long)
# Its own workers, two (the cores a replica has here): long prompts do not take the default executor's
# threads from grammar compiles and trace exports, nor more CPU than that.
TOKENIZE_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="argosy-tokenize")


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(dumps(obj).encode(), status_code=status, media_type="application/json")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(finals: list[RequestOutput]) -> dict[str, Any]:
    """OpenAI's usage: each prompt counted once (not n times), every completion's tokens."""
    prompt = sum(len(out.prompt_token_ids) for out in finals)
    completion = sum(len(c.token_ids) for out in finals for c in out.outputs)
    cached = sum(out.num_cached_tokens for out in finals)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


@dataclass
class ServerState:
    served_model_name: str
    engine: AsyncEngine
    metrics: ServerMetrics
    max_queue: int
    max_body_bytes: int
    root: str | None = None  # the checkpoint served
    revision: str | None = None  # the fleet's revision of the model, when it set one
    created: int = field(default_factory=lambda: int(time.time()))
    tokenizing: int = 0  # admitted requests whose long prompts are being tokenized (they count as waiting)

    def check_ready(self) -> None:
        if self.engine.failed is not None or not self.engine.alive():
            raise APIError(503, "The engine is not running.", code="engine_dead")
        if not self.engine.ready:
            raise APIError(503, "The model is still loading.", code="not_ready", headers={"Retry-After": "5"})

    @property
    def tokenizer(self) -> Any:
        self.check_ready()
        return self.engine.tokenizer

    async def encode(self, text: str, add_special_tokens: bool = True, param: str = "prompt",
                     within_context: bool = True) -> list[int]:
        """Token ids of a prompt: a short one here, a long one by encode_long."""
        if len(text) < LONG_PROMPT_CHARS:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return await self.encode_long(text, add_special_tokens, param, within_context)

    async def encode_long(self, text: str, add_special_tokens: bool = True, param: str = "prompt",
                          within_context: bool = True) -> list[int]:
        """Token ids of a long prompt, from a worker of TOKENIZE_POOL (the tokenizer releases the GIL there),
        after a check that needs no tokenizing (within_context): text longer than the context could hold in
        any tokens is a 400. On the event loop or the engine thread, a 7.5 MB prompt (under the 8 MiB body
        limit) held every other request and stream for 5 s. It is admitted like a waiting request and counted
        as one until its worker is done, even when its client has left: a flood of long prompts is a 503 past
        --max-queue, not an ever longer queue of tokenizing work."""
        tokenizer, context = self.tokenizer, self.engine.max_model_len
        if within_context and len(text) > tokenizer.max_chars(context):
            raise APIError.bad_request(f"the prompt is {len(text):,} characters, more than this model's context of "
                                       f"{context} tokens can hold", param)
        self.admit(1)
        self.tokenizing += 1
        job = asyncio.get_running_loop().run_in_executor(TOKENIZE_POOL, tokenizer.encode, text, add_special_tokens)
        job.add_done_callback(self._tokenized)
        return await asyncio.shield(job)  # a client that leaves does not free the slot before the worker does

    def _tokenized(self, job: asyncio.Future) -> None:
        self.tokenizing -= 1
        if not job.cancelled():
            job.exception()  # retrieved here: nobody may await a job whose client left

    def admit(self, n: int, prompts: int | None = None) -> None:
        """Room for n sequences (each prompt's n completions are n sequences in the engine, as vLLM counts
        them): 1,000 prompts with n=128 were 128,000 waiting sequences, and every other client got 503 until
        they were served or cleaned up."""
        if n > self.max_queue:  # never admitted, however idle the server: a 400, not a 503 to retry (a gateway
            # counts a replica's 503 as a failure: a few such requests ejected every replica of the model)
            by_n = prompts is not None and prompts != n  # n completions of each prompt
            what = (f"{n} sequences ({prompts} prompt{'s' * (prompts > 1)} x n={n // prompts})" if by_n
                    else f"{n} prompts")
            raise APIError.bad_request(f"the request holds {what}, more than this server admits at once "
                                       f"({self.max_queue}, --max-queue)", "n" if by_n else "prompt",
                                       "too_many_prompts")
        if self.engine.num_waiting() + self.tokenizing + n > self.max_queue:
            raise APIError.overloaded(f"The server is overloaded ({self.max_queue} requests waiting); retry later.")

    async def submit(self, requests: list[EngineRequest], arrival: float) -> RequestGroup:
        """Admission (503 past --max-queue waiting requests), then the engine's own validation (400)."""
        self.check_ready()
        self.admit(sum(r.params.n for r in requests), len(requests))
        # The engine would tokenize a text prompt on its own thread, between steps: a long one goes here.
        requests = [dataclasses.replace(r, prompt=await self.encode_long(r.prompt))
                    if isinstance(r.prompt, str) and len(r.prompt) >= LONG_PROMPT_CHARS else r for r in requests]
        try:
            group = await self.engine.add(requests, arrival)
        except InvalidRequestError as exc:
            raise APIError.from_invalid(exc) from None
        except EngineStepError as exc:
            raise APIError(500, str(exc), code="engine_error") from None
        note_group(group)  # for the request's trace spans and access-log line (argosy/observe)
        return group


async def open_request(request) -> tuple[float, ServerState, Fields]:
    """The start of every generation endpoint: arrival time, the ready server, the parsed body (model checked)."""
    arrival = time.monotonic()
    state: ServerState = request.app.state.argosy
    state.check_ready()
    fields = Fields(await read_json_body(request, state.max_body_bytes))
    check_model(fields, state.served_model_name)
    return arrival, state, fields
