"""POST /v1/chat/completions: messages through the checkpoint's chat template, OpenAI's chat API."""

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
from argosy.server.logprobs import chat_logprobs
from argosy.server.protocol import (
    Fields,
    sampling_params,
    scheduling_fields,
    stream_flags,
)
from argosy.server.state import ServerState, dumps, json_response, new_id, open_request, usage
from argosy.server.streaming import DONE, SSEResponse, wait_for_finals

_ROLES = {"system", "user", "assistant", "developer"}


def parse_messages(value: Any) -> list[dict[str, str]]:
    """OpenAI messages -> template messages: text content only (a string or text parts joined)."""
    if not isinstance(value, list) or not value:
        raise APIError.bad_request("'messages' must be a non-empty list.", "messages")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise APIError.bad_request(f"messages[{i}] must be an object.", "messages")
        role = message.get("role")
        if role not in _ROLES:
            raise APIError.bad_request(
                f"messages[{i}].role must be system, user, assistant or developer, got {role!r}.", "messages")
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError.bad_request(f"messages[{i}].content: only text parts are supported.", "messages")
                texts.append(part["text"])
            content = "\n".join(texts)
        elif content is None and role == "assistant":
            content = ""
        elif not isinstance(content, str):
            raise APIError.bad_request(f"messages[{i}].content must be a string or a list of text parts.", "messages")
        # Templates know system, not OpenAI's newer developer role.
        entry = {"role": "system" if role == "developer" else role, "content": content}
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        messages.append(entry)
    return messages


def _logprob_settings(fields: Fields) -> int | None:
    """Chat's logprobs (bool) + top_logprobs (0..20) -> the engine's top-k logprobs, or None."""
    want = fields.get_bool("logprobs", False)
    top = fields.get_int("top_logprobs")
    if top is not None and not want:
        raise APIError.bad_request("'top_logprobs' needs 'logprobs' set to true.", "top_logprobs")
    if top is not None and not 0 <= top <= 20:
        raise APIError.bad_request(f"top_logprobs must be between 0 and 20, got {top}.", "top_logprobs")
    return (top or 0) if want else None


def _prompt_ids(state: ServerState, fields: Fields, messages: list[dict[str, str]]) -> list[int]:
    tokenizer = state.tokenizer
    if not tokenizer.has_chat_template:
        raise APIError.bad_request("This model has no chat template; use /v1/completions.", "messages")
    add_generation_prompt = fields.get_bool("add_generation_prompt", True)
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    except Exception as exc:  # the template's own checks (e.g. roles must alternate)
        raise APIError.bad_request(f"The chat template rejected the messages: {exc}", "messages") from None
    # The template writes the special tokens (BOS...) itself; encoding must not add a second BOS.
    return tokenizer.encode(text, add_special_tokens=False)


async def create_chat_completion(request: Request) -> Response | SSEResponse:
    arrival, state, fields = await open_request(request)
    messages = parse_messages(fields.body.get("messages"))
    fields.reject_unsupported("tools", "tool calling is not available")
    fields.reject_unsupported("functions", "function calling is not available")
    response_format = fields.get_dict("response_format")
    if response_format and response_format.get("type", "text") != "text":
        raise APIError.bad_request("Only the 'text' response_format is supported.", "response_format")
    stream, include_usage = stream_flags(fields)
    max_tokens, max_tokens_field = fields.get_int("max_completion_tokens"), "max_completion_tokens"
    if max_tokens is None:  # neither: up to the context, OpenAI's chat default
        max_tokens, max_tokens_field = fields.get_int("max_tokens"), "max_tokens"
    params = sampling_params(fields, max_tokens=max_tokens, logprobs=_logprob_settings(fields),
                             max_tokens_field=max_tokens_field)
    priority, cache_salt = scheduling_fields(fields)
    prompt = _prompt_ids(state, fields, messages)
    response_id = new_id("chatcmpl")
    group = await state.submit([EngineRequest(response_id, prompt, params, priority, cache_salt)], arrival)
    if stream:
        body = _stream(state, response_id, params, group, include_usage)
        return SSEResponse(body, on_close=lambda: state.engine.abort(group))
    finals = await wait_for_finals(state, request, group)
    if isinstance(finals, Response):
        return finals
    return json_response(_response_body(state, response_id, params, finals))


def _response_body(state: ServerState, response_id: str, params: SamplingParams, finals: list[Any]) -> dict:
    choices = []
    for c in finals[0].outputs:
        logprobs = None
        if params.logprobs is not None and c.logprobs is not None:
            content = chat_logprobs(c.token_ids, c.logprobs, 0, len(c.token_ids), params.logprobs, state.tokenizer)
            logprobs = {"content": content, "refusal": None}
        choices.append({
            "index": c.index,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": logprobs,
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        })
    choices.sort(key=lambda choice: choice["index"])
    return {"id": response_id, "object": "chat.completion", "created": int(time.time()),
            "model": state.served_model_name, "choices": choices, "usage": usage(finals)}


async def _stream(state: ServerState, response_id: str, params: SamplingParams, group: RequestGroup,
                  include_usage: bool) -> AsyncIterator[bytes]:
    created = int(time.time())
    head = (f'data: {{"id":"{response_id}","object":"chat.completion.chunk","created":{created},'
            f'"model":{dumps(state.served_model_name)},"choices":[').encode()
    tail = b'],"usage":null}\n\n' if include_usage else b"]}\n\n"
    top_k = params.logprobs
    tokenizer = state.tokenizer
    tracker = DeltaTracker([group.requests[0].request_id], params.n, every_token=top_k is not None)
    try:
        # The role goes out at once, before the first token: the client sees the stream is alive.
        yield b"".join(head + dumps({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                     "finish_reason": None}).encode() + tail for i in range(params.n))
        while outputs := await group.next_outputs():
            parts = []
            for d in tracker.deltas(outputs):
                logprobs = None
                if top_k is not None and d.completion.logprobs is not None:
                    content = chat_logprobs(d.completion.token_ids, d.completion.logprobs, d.token_start,
                                            d.token_end, top_k, tokenizer)
                    logprobs = {"content": content, "refusal": None}
                if logprobs is None and d.finish_reason is None:  # the per-token chunk, without a dict
                    parts.append(b'%s{"index":%d,"delta":{"content":%s},"logprobs":null,"finish_reason":null}%s'
                                 % (head, d.index, dumps(d.text).encode(), tail))
                    continue
                choice: dict[str, Any] = {"index": d.index, "delta": {"content": d.text} if d.text else {},
                                          "logprobs": logprobs, "finish_reason": d.finish_reason}
                if d.finish_reason:
                    choice["stop_reason"] = d.completion.stop_reason
                parts.append(head + dumps(choice).encode() + tail)
            if parts:
                yield b"".join(parts)
        if include_usage:
            body = {"id": response_id, "object": "chat.completion.chunk", "created": created,
                    "model": state.served_model_name, "choices": [],
                    "usage": usage([group.final[group.requests[0].request_id]])}
            yield b"data: " + dumps(body).encode() + b"\n\n"
    except EngineStepError as exc:
        yield b"data: " + APIError(500, str(exc), code="engine_error").body() + b"\n\n"
    yield DONE
