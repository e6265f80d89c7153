"""Tool calling on the chat API: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`, the tool-call
turns of a conversation for the chat template, and the model's calls back as `tool_calls`.

`required` or a named function is enforced by a grammar in the model family's own call format
(tool_formats.py), so the call always parses; with `auto` the output is scanned for calls.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from argosy.engine.structured import StructuredOutputsParams
from argosy.server.errors import APIError
from argosy.server.protocol import Fields
from argosy.server.tool_formats import Scan, ScannedCall, ToolFormat, format_for_template

_FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolRequest:
    tools: list[dict[str, Any]]
    choice: str  # auto | none | required | function
    function: str | None  # the named function when choice == "function"
    parallel: bool
    format: ToolFormat

    @property
    def parses(self) -> bool:
        return self.choice != "none"

    def grammar(self) -> StructuredOutputsParams | None:
        if self.choice not in ("required", "function"):
            return None
        tools = [t for t in self.tools if self.choice == "required" or t["function"]["name"] == self.function]
        tag = self.format.structural_tag(tools, self.parallel and self.choice == "required")
        return StructuredOutputsParams(structural_tag=json.dumps(tag), param="tools")


def _check_tool(i: int, tool: Any) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise APIError.bad_request(f"{where} must be an object of type 'function'.", "tools")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise APIError.bad_request(f"{where}.function must be an object.", "tools")
    name = function.get("name")
    if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
        raise APIError.bad_request(f"{where}.function.name must be 1-64 letters, digits, '_', '-' or '.'.", "tools")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise APIError.bad_request(f"{where}.function.parameters must be a JSON schema object.", "tools")
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def parse_tools(fields: Fields, chat_template: str | None) -> ToolRequest | None:
    """The request's tools (None without any); 400 on a malformed tool or tool_choice."""
    raw = fields.body.get("tools")
    choice_value = fields.body.get("tool_choice")
    parallel = fields.get_bool("parallel_tool_calls", True)
    fields.reject_unsupported("functions", "use 'tools'")
    fields.reject_unsupported("function_call", "use 'tool_choice'")
    if raw is None or raw == []:
        if choice_value not in (None, "none"):
            raise APIError.bad_request("'tool_choice' is only allowed when 'tools' are given.", "tool_choice")
        return None
    if not isinstance(raw, list):
        raise APIError.bad_request("'tools' must be a list of tools.", "tools")
    tools = [_check_tool(i, t) for i, t in enumerate(raw)]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise APIError.bad_request("tools must have distinct function names.", "tools")
    function = None
    if choice_value is None:
        choice = "auto"
    elif isinstance(choice_value, str) and choice_value in ("auto", "none", "required"):
        choice = choice_value
    elif isinstance(choice_value, dict) and isinstance(choice_value.get("function"), dict):
        choice, function = "function", choice_value["function"].get("name")
        if function not in names:
            raise APIError.bad_request(f"tool_choice names function {function!r}, which is not in 'tools'.",
                                       "tool_choice")
    else:
        raise APIError.bad_request("'tool_choice' must be auto, none, required or "
                                   "{\"type\": \"function\", \"function\": {\"name\": ...}}.", "tool_choice")
    return ToolRequest(tools, choice, function, parallel, format_for_template(chat_template))


def template_messages(messages: list[dict[str, Any]], tools: ToolRequest | None,
                      chat_template: str | None) -> list[dict[str, Any]]:
    """Tool-call turns as chat templates read them (arguments as objects, as transformers' templates expect).
    A template that knows no tools gets them in a system message and the calls as text, in the Hermes format,
    and each result as a user turn that says which function returned it."""
    out = []
    for message in messages:
        message = dict(message)
        calls = message.get("tool_calls")
        if calls:
            message["tool_calls"] = [_template_call(c) for c in calls]
        out.append(message)
    if chat_template is not None and "tool" in chat_template:
        return out
    plain, names = [], {}
    for message in out:
        if message.get("tool_calls"):
            names.update((c.get("id"), c["function"]["name"]) for c in message["tool_calls"])
            text = "\n".join("<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                                                            "arguments": c["function"]["arguments"]})
                             + "\n</tool_call>" for c in message.pop("tool_calls"))
            message["content"] = ((message.get("content") or "") + "\n" + text).strip()
        elif message["role"] == "tool":
            # A plain sentence, not Hermes' <tool_response> tags: a model never trained on those repeats them
            # (SmolLM2-135M-Instruct echoed the tags and the result instead of answering).
            name = names.get(message.get("tool_call_id"), "the function")
            message = {"role": "user", "content": f"The function {name} returned: {message['content']}\n"
                                                  "Answer my question with it."}
        plain.append(message)
    if tools is not None and tools.choice != "none":
        prompt = ("You may call one or more functions. Their signatures are within <tools></tools>:\n<tools>\n"
                  + "\n".join(json.dumps(t) for t in tools.tools) + "\n</tools>\nFor each call, write a JSON "
                  "object with the function name and arguments within <tool_call></tool_call> tags:\n"
                  '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
        if plain and plain[0]["role"] == "system":
            plain[0] = {**plain[0], "content": plain[0]["content"] + "\n\n" + prompt}
        else:
            plain.insert(0, {"role": "system", "content": prompt})
    return plain


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call["function"])
    try:
        function["arguments"] = json.loads(function.get("arguments") or "{}")
    except ValueError:
        pass  # not JSON: the template gets the text
    return {**call, "function": function}


def parse_tool_call_message(i: int, message: dict[str, Any]) -> list[dict[str, Any]]:
    """An assistant message's tool_calls, checked: [{id, type, function: {name, arguments}}]."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        raise APIError.bad_request(f"messages[{i}].tool_calls must be a list.", "messages")
    checked = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not isinstance(function.get("arguments", ""), str):
            raise APIError.bad_request(f"messages[{i}].tool_calls[{j}] must have a function with a name and "
                                       "arguments as a JSON string.", "messages")
        checked.append({"id": call.get("id") or new_call_id(), "type": "function",
                        "function": {"name": function["name"], "arguments": function.get("arguments", "")}})
    return checked


def scan_calls(tools: ToolRequest, text: str, finished: bool) -> Scan:
    """The calls in a choice's text. A forced call (required, or a named function) that max_tokens cut inside
    its name is still that call, with no arguments yet, once the choice is finished: its markup is never
    content (OpenAI and vLLM answer a forced call in tool_calls, its arguments cut where the output was)."""
    scan = tools.format.scan(text)
    if finished and not scan.calls and tools.choice in ("required", "function"):  # the grammar wrote only a call
        name = tools.function
        if name is None and (prefix := tools.format.partial_name(text)) is not None:
            names = [t["function"]["name"] for t in tools.tools if t["function"]["name"].startswith(prefix)]
            name = names[0] if len(names) == 1 else None
        return Scan("", [ScannedCall(name, "")] if name is not None else [], 0, opened=True)
    return scan


def response_message(tools: ToolRequest | None, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
    """The assistant message for a finished choice, and its finish_reason (tool_calls when it called). A call
    cut by max_tokens comes back as streamed: in tool_calls, its arguments as far as they got (finish_reason
    length), and the calls' markup is never content."""
    if tools is None or not tools.parses:
        return {"role": "assistant", "content": text}, finish_reason
    scan = scan_calls(tools, text, True)
    if not scan.calls:
        return {"role": "assistant", "content": scan.content if not scan.opened else scan.content.strip() or None}, \
            finish_reason
    calls = [{"id": new_call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
             for c in scan.calls]
    content = scan.content.strip() or None
    if finish_reason == "stop":  # a named tool_choice finishes with stop, as OpenAI's does
        finish_reason = "stop" if tools.choice == "function" else "tool_calls"
    return {"role": "assistant", "content": content, "tool_calls": calls}, finish_reason


@dataclass
class ToolCallStream:
    """One streamed choice: turns its growing text into content deltas, then OpenAI's tool_calls deltas
    (the call's id, type and name first, then its arguments in pieces)."""

    tools: ToolRequest
    content_sent: int = 0
    ids: list[str] = field(default_factory=list)
    args_sent: list[int] = field(default_factory=list)

    def deltas(self, text: str, finished: bool) -> list[dict[str, Any]]:
        scan = scan_calls(self.tools, text, finished)
        out: list[dict[str, Any]] = []
        end = len(scan.content) - (0 if finished or scan.calls else scan.held)
        if not self.ids and end > self.content_sent:
            out.append({"content": scan.content[self.content_sent:end]})
            self.content_sent = end
        for i, call in enumerate(scan.calls):
            if i == len(self.ids):
                self.ids.append(new_call_id())
                self.args_sent.append(0)
                out.append({"tool_calls": [{"index": i, "id": self.ids[i], "type": "function",
                                            "function": {"name": call.name, "arguments": ""}}]})
            if len(call.arguments) > self.args_sent[i]:
                piece = call.arguments[self.args_sent[i]:]
                out.append({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                self.args_sent[i] = len(call.arguments)
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        if reason == "stop" and self.ids and self.tools.choice != "function":
            return "tool_calls"
        return reason
