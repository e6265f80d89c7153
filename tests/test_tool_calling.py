"""Tool calling through the official openai client on a random-weight model: `required` and named calls go
through the grammar in the model family's format, so they always parse; results go back through the template."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from argosy.server.tool_formats import FORMATS, format_for_template
from argosy.server.tools import ToolCallStream, ToolRequest, response_message
from tests.server_fixtures import MODEL_NAME
from tests.structured_fixtures import TOOL_TEMPLATE

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                                            "unit": {"enum": ["C", "F"]}, "days": {"type": "integer", "minimum": 1,
                                                                                  "maximum": 7}},
           "required": ["city", "unit", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tool_model_server):
    return tool_model_server


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as c:
        yield c


def _check_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_always_calls_a_tool_that_parses(client):
    done = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                          temperature=1.0, n=4, seed=1, max_tokens=300)
    for choice in done.choices:
        assert choice.finish_reason == "tool_calls"
        _check_calls(choice.message.tool_calls)


def test_named_function_and_no_parallel_calls(client):
    done = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, temperature=1.0, n=3, seed=2, max_tokens=300,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False)
    for choice in done.choices:
        assert choice.finish_reason == "stop"  # as OpenAI answers a named tool_choice
        assert [c.function.name for c in choice.message.tool_calls] == ["get_time"]
        _check_calls(choice.message.tool_calls)


def test_streamed_tool_call_deltas_are_shaped_as_openai(client):
    stream = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                            temperature=1.0, seed=4, max_tokens=300, stream=True)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                if delta.id is not None:  # the first delta of a call: id, type and name
                    assert delta.index not in calls and delta.type == "function" and delta.function.name
                    calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": ""}
                calls[delta.index]["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls" and calls
    for call in calls.values():
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_tool_results_go_back_through_the_chat_template(client, server):
    first = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                           temperature=0.0, max_tokens=300, parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    conversation = [*MESSAGES, first.choices[0].message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    second = client.chat.completions.create(model=MODEL_NAME, messages=conversation, tools=TOOLS, tool_choice="none",
                                            max_tokens=8)
    assert second.choices[0].message.tool_calls is None
    tokens = httpx.post(server.url + "/tokenize", json={"messages": conversation, "tools": TOOLS}, timeout=10).json()
    prompt = httpx.post(server.url + "/detokenize", json={"tokens": tokens["tokens"]}, timeout=10).json()["prompt"]
    assert '<tool_response>\n{"temperature": 21}\n</tool_response>' in prompt
    assert f'"name": "{call.function.name}", "arguments": {json.dumps(json.loads(call.function.arguments))}' in prompt
    assert '"name": "get_time"' in prompt.split("<|im_start|>user")[0]  # the tools, in the system turn


@pytest.mark.parametrize("body, param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}],
      "tool_choice": "required"}, "tools"),
])
def test_bad_tool_requests_are_400(client, body, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=5, **body)
    assert err.value.body["param"] == param


def test_formats_are_chosen_from_the_template():
    assert format_for_template(TOOL_TEMPLATE).name == "hermes"
    assert format_for_template("{{ '[TOOL_CALLS]' }}").name == "mistral"
    assert format_for_template("<|python_tag|>{{ x }}").name == "llama3"
    assert format_for_template(None).name == "hermes"


@pytest.mark.parametrize("family, text", [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "a": "}{"}}\n'
               '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo", "a": "}{"}}; '
               '{"name": "get_time", "parameters": {"zone": "CET"}}'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "a": "}{"}}, '
                '{"name": "get_time", "arguments": {"zone": "CET"}}]'),
])
def test_each_family_streams_what_it_parses(family, text):
    tools = ToolRequest(TOOLS, "auto", None, True, FORMATS[family])
    stream, content, args, names = ToolCallStream(tools), "", {}, {}
    for end in range(1, len(text) + 1):  # one character at a time: every split point of every marker
        for delta in stream.deltas(text[:end], end == len(text)):
            content += delta.get("content", "")
            for call in delta.get("tool_calls", []):
                if "id" in call:
                    names[call["index"]] = call["function"]["name"]
                args[call["index"]] = args.get(call["index"], "") + call["function"]["arguments"]
    assert names == {0: "get_weather", 1: "get_time"}
    assert [json.loads(args[i]) for i in (0, 1)] == [{"city": "Oslo", "a": "}{"}, {"zone": "CET"}]
    assert content.strip() == ("Let me check." if family == "hermes" else "")
    assert stream.finish_reason("stop") == "tool_calls"


def test_gateway_guardrails_read_tool_call_arguments_as_text():
    import asyncio

    from argosy.config import GuardrailsConfig
    from argosy.gateway.guardrails import Guardrails
    from argosy.gateway.stream import StreamFilter, rewrite_full

    guard = Guardrails(GuardrailsConfig(output=[{"pii": "redact"}], stream_window_chars=8), lambda: None)
    message = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "send", "arguments": '{"to": "bob@example.com"}'}}]}}]}
    body = json.loads(asyncio.run(rewrite_full(guard, json.dumps(message).encode())))
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"to": "[EMAIL]"}'

    def event(choice):
        return b"data: " + json.dumps({"id": "x", "choices": [choice]}).encode() + b"\n\n"

    pieces = ['{"to": "bo', 'b@exam', 'ple.com", ', '"n": 1}']
    events = [event({"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                            "function": {"name": "send", "arguments": ""}}]},
                     "finish_reason": None})]
    events += [event({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": p}}]},
                      "finish_reason": None}) for p in pieces]
    events += [event({"index": 0, "delta": {}, "finish_reason": "tool_calls"}), b"data: [DONE]\n\n"]

    async def run() -> bytes:
        stream = StreamFilter(guard)
        return b"".join([await stream.feed(e) for e in events])

    out = [json.loads(line[6:]) for line in asyncio.run(run()).decode().split("\n\n") if line.startswith("data: {")]
    args = "".join(c["function"].get("arguments", "") for ev in out for ch in ev["choices"]
                   for c in (ch.get("delta") or {}).get("tool_calls", []))
    assert args == '{"to": "[EMAIL]", "n": 1}'
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_calls_through_the_gateway_unchanged(server):
    from tests.gateway_fixtures import start_gateway

    gateway = start_gateway({"models": [{"name": MODEL_NAME, "upstreams": [server.url],
                                         "guardrails": {"output": [{"pii": "redact"}]}}]})
    try:
        with openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0) as client:
            done = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, seed=6,
                                                  tool_choice="required", temperature=1.0, max_tokens=300)
            assert done.choices[0].finish_reason == "tool_calls"
            _check_calls(done.choices[0].message.tool_calls)
            stream = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, seed=6,
                                                    tool_choice="required", temperature=1.0, max_tokens=300,
                                                    stream=True)
            args = "".join(d.function.arguments or "" for chunk in stream for c in chunk.choices
                           for d in c.delta.tool_calls or [])
            assert args == "".join(c.function.arguments for c in done.choices[0].message.tool_calls)
            card = client.models.list().data[0]  # the gateway's card: the replica's context, the fleet's revision
            assert (card.id, card.max_model_len, card.revision, card.kind) == (MODEL_NAME, 1024, "v1", "generate")
    finally:
        gateway.stop()


def _streamed(tools, text):
    """What a client assembles from the stream of `text`, cut where it ends (max_tokens)."""
    stream, content, calls = ToolCallStream(tools), "", {}
    for end in range(1, len(text) + 1):
        for delta in stream.deltas(text[:end], end == len(text)):
            content += delta.get("content", "")
            for call in delta.get("tool_calls", []):
                if "id" in call:
                    calls[call["index"]] = [call["function"]["name"], ""]
                calls[call["index"]][1] += call["function"]["arguments"]
    return content.strip() or None, [tuple(c) for _, c in sorted(calls.items())]


@pytest.mark.parametrize("choice, function", [("function", "get_weather"), ("required", None), ("auto", None)])
def test_a_call_cut_by_max_tokens_is_a_call_streamed_or_not_never_markup(choice, function):
    """A forced call that max_tokens cut came back as its raw markup in content (`<tool_call>\n{"name": "get`),
    and streamed as nothing at all. Now, cut anywhere, both give the same: the call in tool_calls with its
    arguments as far as they got; a forced call's name is known from the request, or from the tools, once its
    first characters single one out."""
    whole = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C", "days": 2}}\n</tool_call>'
    tools = ToolRequest(TOOLS, choice, function, False, FORMATS["hermes"])
    name_at = whole.index("get_weather")
    for end in range(1, len(whole) + 1):
        text = whole[:end]
        message, finish = response_message(tools, text, "length")
        if choice != "auto":  # the grammar wrote a call and nothing else: no piece of its markup is content
            assert message["content"] is None, (end, message)
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
        assert (message["content"], calls) == _streamed(tools, text), text
        known = choice == "function" and end > len("<tool_call>\n{") or choice == "required" and end > name_at + 4
        if known or end >= name_at + len("get_weather\""):
            assert [name for name, _ in calls] == ["get_weather"], text
            assert calls[0][1] in whole
        assert finish == "length"
    message, finish = response_message(tools, whole, "stop")
    assert json.loads(message["tool_calls"][0]["function"]["arguments"])["days"] == 2
    assert finish == ("stop" if choice == "function" else "tool_calls")


def test_forced_calls_cut_short_through_the_server_agree_streamed_and_not(client):
    for max_tokens in (2, 6, 12, 20):
        body = dict(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=max_tokens,
                    tool_choice={"type": "function", "function": {"name": "get_weather"}})
        done = client.chat.completions.create(**body).choices[0]
        assert done.finish_reason == "length" and "<tool_call>" not in (done.message.content or "")
        assert [c.function.name for c in done.message.tool_calls] == ["get_weather"]
        streamed = {"name": None, "arguments": ""}
        for chunk in client.chat.completions.create(**body, stream=True):
            for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                streamed["name"] = delta.function.name or streamed["name"]
                streamed["arguments"] += delta.function.arguments or ""
        assert streamed == {"name": "get_weather", "arguments": done.message.tool_calls[0].function.arguments}
