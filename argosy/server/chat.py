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
from argosy.server.logprobs import chat_logprobs, vllm_prompt_logprobs
from argosy.server.protocol import (
    Fields,
    chat_template_options,
    sampling_params,
    scheduling_fields,
    stream_flags,
)
from argosy.server.state import ServerState, dumps, json_response, new_id, open_request, usage
from argosy.server.streaming import DONE, SSEResponse, wait_for_finals
from argosy.server.structured import check_grammar, parse_structured_outputs
from argosy.server.tools import (
    ToolCallStream,
    ToolRequest,
    parse_tool_call_message,
    parse_tools,
    response_message,
    template_messages,
)

_ROLES = {"system", "user", "assistant", "developer", "tool"}


def _text(i: int, content: Any) -> str:
    """A message's content: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError.bad_request(f"messages[{i}].content: only text parts are supported.", "messages")
            texts.append(part["text"])
        return "\n".join(texts)
    raise APIError.bad_request(f"messages[{i}].content must be a string or a list of text parts.", "messages")


def parse_messages(value: Any) -> list[dict[str, Any]]:
    """OpenAI messages -> template messages: text content (a string or text parts joined), an assistant's
    tool_calls, a tool result's tool_call_id."""
    if not isinstance(value, list) or not value:
        raise APIError.bad_request("'messages' must be a non-empty list.", "messages")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise APIError.bad_request(f"messages[{i}] must be an object.", "messages")
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLES:  # a list or an object is no role (nor hashable)
            raise APIError.bad_request(
                f"messages[{i}].role must be system, user, assistant, developer or tool, got {role!r}.", "messages")
        content = message.get("content")
        # Templates know system, not OpenAI's newer developer role.
        entry: dict[str, Any] = {"role": "system" if role == "developer" else role}
        if role == "assistant" and message.get("tool_calls"):
            entry["tool_calls"] = parse_tool_call_message(i, message)
        entry["content"] = "" if content is None and role == "assistant" else _text(i, content)
        if role == "tool":
            if not isinstance(message.get("tool_call_id"), str):
                raise APIError.bad_request(f"messages[{i}].tool_call_id must be the id of the call answered.",
                                           "messages")
            entry["tool_call_id"] = message["tool_call_id"]
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


async def _prompt_ids(state: ServerState, fields: Fields, messages: list[dict[str, Any]],
                      tools: ToolRequest | None) -> list[int]:
    tokenizer = state.tokenizer
    if not tokenizer.has_chat_template:
        raise APIError.bad_request("This model has no chat template; use /v1/completions.", "messages")
    options = chat_template_options(fields)
    messages = template_messages(messages, tools, tokenizer.chat_template)
    extra = {"tools": tools.tools} if tools is not None else {}
    try:
        text = tokenizer.apply_chat_template(messages, **options, **extra)
    except Exception as exc:  # the template's own checks (e.g. roles must alternate)
        raise APIError.bad_request(f"The chat template rejected the messages: {exc}", "messages") from None
    # The template writes the special tokens (BOS...) itself; encoding must not add a second BOS.
    return await state.encode(text, add_special_tokens=False, param="messages")


async def create_chat_completion(request: Request) -> Response | SSEResponse:
    arrival, state, fields = await open_request(request)
    messages = parse_messages(fields.body.get("messages"))
    tools = parse_tools(fields, state.tokenizer.chat_template)
    structured = parse_structured_outputs(fields)
    if tools is not None and (tool_grammar := tools.grammar()) is not None:
        if structured is not None:
            raise APIError.bad_request(f"tool_choice {tools.choice!r} already fixes the output's form; "
                                       f"drop {structured.param}.", "tool_choice")
        structured = tool_grammar
    stream, include_usage = stream_flags(fields)
    max_tokens, max_tokens_field = fields.get_int("max_completion_tokens"), "max_completion_tokens"
    if max_tokens is None:  # neither: up to the context, OpenAI's chat default
        max_tokens, max_tokens_field = fields.get_int("max_tokens"), "max_tokens"
    params = sampling_params(fields, max_tokens=max_tokens, logprobs=_logprob_settings(fields),
                             max_tokens_field=max_tokens_field, structured_outputs=structured)
    if tools is not None and tools.parses and tools.format.special_marker:
        params.skip_special_tokens = False  # the calls' marker is a special token: the parser must see it
    priority, cache_salt = scheduling_fields(fields)
    prompt = await _prompt_ids(state, fields, messages, tools)
    await check_grammar(structured)
    response_id = new_id("chatcmpl")
    group = await state.submit([EngineRequest(response_id, prompt, params, priority, cache_salt)], arrival)
    if stream:
        body = _stream(state, response_id, params, group, include_usage, tools)
        return SSEResponse(body, on_close=lambda: state.engine.abort(group))
    finals = await wait_for_finals(state, request, group)
    if isinstance(finals, Response):
        return finals
    return json_response(_response_body(state, response_id, params, finals, tools))


def _response_body(state: ServerState, response_id: str, params: SamplingParams, finals: list[Any],
                   tools: ToolRequest | None) -> dict:
    choices = []
    for c in finals[0].outputs:
        logprobs = None
        if params.logprobs is not None and c.logprobs is not None:
            content = chat_logprobs(c.token_ids, c.logprobs, 0, len(c.token_ids), params.logprobs, state.tokenizer)
            logprobs = {"content": content, "refusal": None}
        message, finish_reason = response_message(tools, c.text, c.finish_reason)
        choices.append({
            "index": c.index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
            "stop_reason": c.stop_reason,
        })
    choices.sort(key=lambda choice: choice["index"])
    body = {"id": response_id, "object": "chat.completion", "created": int(time.time()),
            "model": state.served_model_name, "choices": choices, "usage": usage(finals)}
    if params.prompt_logprobs is not None and finals[0].prompt_logprobs is not None:  # vLLM's extra field
        body["prompt_logprobs"] = vllm_prompt_logprobs(finals[0].prompt_logprobs)
    return body


async def _stream(state: ServerState, response_id: str, params: SamplingParams, group: RequestGroup,
                  include_usage: bool, tools: ToolRequest | None) -> AsyncIterator[bytes]:
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
        calls = [ToolCallStream(tools) for _ in range(params.n)] if tools is not None and tools.parses else None
        while outputs := await group.next_outputs():
            parts = []
            for d in tracker.deltas(outputs):
                if calls is not None:  # tool calls: deltas from the choice's whole text so far
                    parts.extend(_tool_chunks(head, tail, d, calls[d.index]))
                    continue
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


def _tool_chunks(head: bytes, tail: bytes, d: Any, stream: ToolCallStream) -> list[bytes]:
    """A choice's chunks under tools: content deltas, then tool_calls deltas; the last carries the finish."""
    deltas = stream.deltas(d.completion.text, d.finish_reason is not None)
    chunks = [head + dumps({"index": d.index, "delta": delta, "logprobs": None, "finish_reason": None}).encode()
              + tail for delta in deltas]
    if d.finish_reason:
        last = {"index": d.index, "delta": {}, "logprobs": None, "finish_reason": stream.finish_reason(d.finish_reason),
                "stop_reason": d.completion.stop_reason}
        chunks.append(head + dumps(last).encode() + tail)
    return chunks
