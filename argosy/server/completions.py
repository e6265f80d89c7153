"""POST /v1/completions: OpenAI's legacy completions API (plus vLLM's sampling extras)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from argosy.engine.sampling_params import SamplingParams
from argosy.server.async_engine import EngineRequest, EngineStepError, RequestGroup
from argosy.server.deltas import DeltaTracker
from argosy.server.errors import APIError
from argosy.server.logprobs import completion_logprobs
from argosy.server.protocol import (
    sampling_params,
    scheduling_fields,
    stream_flags,
)
from argosy.server.state import ServerState, dumps, json_response, new_id, open_request, usage
from argosy.server.streaming import DONE, SSEResponse, wait_for_finals
from argosy.server.structured import check_grammar, parse_structured_outputs

Prompt = str | list[int]


def parse_prompts(value: Any) -> list[Prompt]:
    """A string, a list of strings, a list of token ids or a list of token-id lists."""
    bad = APIError.bad_request(
        "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists.", "prompt")
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise bad
    if all(isinstance(v, str) for v in value):
        return list(value)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [value]
    if all(isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v)
           for v in value):
        return list(value)
    raise bad


class _Job:
    """One completions request after parsing: what the response needs besides the outputs."""

    def __init__(self, state: ServerState, prompts: list[Prompt], params: SamplingParams, echo: bool):
        self.state = state
        self.id = new_id("cmpl")
        self.created = int(time.time())
        self.prompts = prompts
        self.params = params
        self.echo = echo

    def echo_text(self, prompt_index: int) -> str:
        prompt = self.prompts[prompt_index]
        if isinstance(prompt, str):
            return prompt
        return self.state.engine.tokenizer.decode(prompt, skip_special_tokens=self.params.skip_special_tokens)


async def create_completion(request: Request) -> Response | SSEResponse:
    arrival, state, fields = await open_request(request)
    prompts = parse_prompts(fields.body.get("prompt"))
    stream, include_usage = stream_flags(fields)
    echo = fields.get_bool("echo", False)
    logprobs = fields.get_int("logprobs")
    if echo and logprobs is not None:
        raise APIError.bad_request("echo with logprobs needs prompt logprobs, which this server does not compute.",
                                   "echo")
    fields.reject_unsupported("suffix", "this server does not insert text")
    structured = parse_structured_outputs(fields)
    params = sampling_params(fields, max_tokens=fields.get_int("max_tokens", 16), logprobs=logprobs,
                             structured_outputs=structured)
    await check_grammar(structured)
    priority, cache_salt = scheduling_fields(fields)
    job = _Job(state, prompts, params, echo)
    requests = [EngineRequest(f"{job.id}-{i}", p, params, priority, cache_salt) for i, p in enumerate(prompts)]
    group = await state.submit(requests, arrival)
    if stream:
        return SSEResponse(_stream(job, group, include_usage), on_close=lambda: state.engine.abort(group))
    finals = await wait_for_finals(state, request, group)
    if isinstance(finals, Response):
        return finals
    return json_response(_response_body(job, finals))


def _response_body(job: _Job, finals: list[Any]) -> dict[str, Any]:
    n, tokenizer = job.params.n, job.state.engine.tokenizer
    choices = []
    for p, out in enumerate(finals):
        prefix = job.echo_text(p) if job.echo else ""
        for c in out.outputs:
            lp = None
            if job.params.logprobs is not None and c.logprobs is not None:
                lp, _ = completion_logprobs(c.token_ids, c.logprobs, 0, len(c.token_ids), len(prefix), tokenizer)
            choices.append({
                "index": p * n + c.index,
                "text": prefix + c.text,
                "logprobs": lp,
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            })
    choices.sort(key=lambda choice: choice["index"])
    return {
        "id": job.id,
        "object": "text_completion",
        "created": job.created,
        "model": job.state.served_model_name,
        "choices": choices,
        "usage": usage(finals),
    }


async def _stream(job: _Job, group: RequestGroup, include_usage: bool) -> AsyncIterator[bytes]:
    # Every chunk shares its head and tail: only the choice is serialised per chunk.
    head = (f'data: {{"id":"{job.id}","object":"text_completion","created":{job.created},'
            f'"model":{dumps(job.state.served_model_name)},"choices":[').encode()
    tail = b'],"usage":null}\n\n' if include_usage else b"]}\n\n"
    n, want_logprobs = job.params.n, job.params.logprobs is not None
    tokenizer = job.state.engine.tokenizer
    tracker = DeltaTracker([r.request_id for r in group.requests], n, every_token=want_logprobs)
    offsets = [0] * (len(job.prompts) * n)  # text_offset of each choice's next token
    try:
        if job.echo:
            parts = []
            for p in range(len(job.prompts)):
                text = job.echo_text(p)
                for i in range(n):
                    parts.append(head + _choice(p * n + i, text, None, None, None) + tail)
            yield b"".join(parts)
        while outputs := await group.next_outputs():
            parts = []
            for d in tracker.deltas(outputs):
                lp = None
                if want_logprobs and d.completion.logprobs is not None:
                    lp, offsets[d.index] = completion_logprobs(d.completion.token_ids, d.completion.logprobs,
                                                               d.token_start, d.token_end, offsets[d.index], tokenizer)
                stop_reason = d.completion.stop_reason if d.finish_reason else None
                parts.append(head + _choice(d.index, d.text, lp, d.finish_reason, stop_reason) + tail)
            if parts:
                yield b"".join(parts)
        if include_usage:
            finals = [group.final[r.request_id] for r in group.requests]
            body = {"id": job.id, "object": "text_completion", "created": job.created,
                    "model": job.state.served_model_name, "choices": [], "usage": usage(finals)}
            yield b"data: " + dumps(body).encode() + b"\n\n"
    except EngineStepError as exc:
        yield b"data: " + APIError(500, str(exc), code="engine_error").body() + b"\n\n"
    yield DONE


def _choice(index: int, text: str, logprobs: Any, finish_reason: str | None, stop_reason: Any) -> bytes:
    if logprobs is None and finish_reason is None:  # the per-token chunk: no dict, one string encode
        return b'{"index":%d,"text":%s,"logprobs":null,"finish_reason":null,"stop_reason":null}' % (
            index, dumps(text).encode())
    return dumps({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
                  "stop_reason": stop_reason}).encode()
