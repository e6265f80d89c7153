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
from argosy.server.logprobs import completion_logprobs, echo_logprobs, joined, vllm_prompt_logprobs
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

    def __init__(self, state: ServerState, prompts: list[Prompt], params: SamplingParams, echo: bool,
                 echo_logprobs: bool = False, vllm_prompt_logprobs: bool = False):
        self.state = state
        self.id = new_id("cmpl")
        self.created = int(time.time())
        self.prompts = prompts
        self.params = params
        self.echo = echo
        self.echo_logprobs = echo_logprobs  # echo with logprobs: the prompt's tokens lead each choice's logprobs
        self.vllm_prompt_logprobs = vllm_prompt_logprobs  # vLLM's prompt_logprobs field: each choice carries them

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
    fields.reject_unsupported("suffix", "this server does not insert text")
    structured = parse_structured_outputs(fields)
    max_tokens = fields.get_int("max_tokens", 16)
    # echo with max_tokens 0: the prompt alone (scored, with logprobs), as vLLM answers; one token is generated
    # (the prompt must be computed) and left out of the answer.
    prompt_only = echo and max_tokens == 0
    if prompt_only and stream:
        raise APIError.bad_request("max_tokens 0 (the echoed prompt alone) is answered whole, not streamed.",
                                   "max_tokens")
    # echo with logprobs: the prompt's tokens get theirs too (lm-evaluation-harness scores continuations so).
    params = sampling_params(fields, max_tokens=1 if prompt_only else max_tokens, logprobs=logprobs,
                             structured_outputs=structured, prompt_logprobs=logprobs if echo else None)
    await check_grammar(structured)
    priority, cache_salt = scheduling_fields(fields)
    job = _Job(state, prompts, params, echo, echo_logprobs=echo and logprobs is not None,
               vllm_prompt_logprobs=fields.body.get("prompt_logprobs") is not None)
    requests = [EngineRequest(f"{job.id}-{i}", p, params, priority, cache_salt) for i, p in enumerate(prompts)]
    group = await state.submit(requests, arrival)
    if stream:
        return SSEResponse(_stream(job, group, include_usage), on_close=lambda: state.engine.abort(group))
    finals = await wait_for_finals(state, request, group)
    if isinstance(finals, Response):
        return finals
    if prompt_only:
        for completion in (c for out in finals for c in out.outputs):
            completion.text, completion.token_ids, completion.stop_reason = "", [], None
            completion.logprobs = [] if completion.logprobs is not None else None
            completion.finish_reason = "length"
    return json_response(_response_body(job, finals))


def _echo_logprobs(job: _Job, out: Any) -> dict[str, list[Any]] | None:
    """The echoed prompt's legacy logprobs, when echo and logprobs were both asked (else None)."""
    if not job.echo_logprobs or out.prompt_logprobs is None:
        return None
    return echo_logprobs(out.prompt_token_ids, out.prompt_logprobs, job.state.engine.tokenizer)


def _response_body(job: _Job, finals: list[Any]) -> dict[str, Any]:
    n, tokenizer = job.params.n, job.state.engine.tokenizer
    choices = []
    for p, out in enumerate(finals):
        prefix = job.echo_text(p) if job.echo else ""
        echoed = _echo_logprobs(job, out)
        start = echoed["text_offset"][-1] + len(echoed["tokens"][-1]) if echoed else len(prefix)
        for c in out.outputs:
            lp = None
            if job.params.logprobs is not None and c.logprobs is not None:
                lp, _ = completion_logprobs(c.token_ids, c.logprobs, 0, len(c.token_ids), start, tokenizer)
                lp = joined(echoed, lp) if echoed else lp
            choice = {
                "index": p * n + c.index,
                "text": prefix + c.text,
                "logprobs": lp,
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            }
            if job.vllm_prompt_logprobs and out.prompt_logprobs is not None:
                choice["prompt_logprobs"] = vllm_prompt_logprobs(out.prompt_logprobs)
            choices.append(choice)
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
    prompt_index = {r.request_id: p for p, r in enumerate(group.requests)}
    try:
        if job.echo and not job.echo_logprobs:
            parts = []
            for p in range(len(job.prompts)):
                text = job.echo_text(p)
                for i in range(n):
                    parts.append(head + _choice(p * n + i, text, None, None, None) + tail)
            yield b"".join(parts)
        echoed: set[int] = set()  # echo with logprobs: each prompt goes out with its first output's logprobs
        while outputs := await group.next_outputs():
            parts = []
            for out in outputs if job.echo_logprobs else ():
                p = prompt_index[out.request_id]
                if p not in echoed and (lp := _echo_logprobs(job, out)) is not None:
                    echoed.add(p)
                    for i in range(n):
                        offsets[p * n + i] = lp["text_offset"][-1] + len(lp["tokens"][-1])
                        parts.append(head + _choice(p * n + i, job.echo_text(p), lp, None, None) + tail)
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
