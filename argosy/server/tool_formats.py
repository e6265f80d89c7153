"""How a model family writes tool calls: finding them in its output (streamed or whole) and the grammar
that makes it write one.

- hermes (Qwen 2.5/3, Hermes, and the default): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  one block per call.
- llama3: `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`; calls separated by `;`.
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.

The family is read from the chat template (the markers it writes), as vLLM's --tool-call-parser names it.
Output is scanned, not parsed whole: each call's name once complete, and its arguments as raw JSON text
that grows token by token (arguments end where their JSON value closes), so streaming and the final
response see the same text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')
_PARTIAL_NAME = re.compile(r'"name"\s*:\s*"([a-zA-Z0-9_.-]*)$')
_DECODER = json.JSONDecoder()


@dataclass
class ScannedCall:
    name: str
    arguments: str  # raw JSON text so far (cut short where the output was)


@dataclass
class Scan:
    content: str  # the text before the calls (all of it when there are none)
    calls: list[ScannedCall]
    held: int  # trailing characters of content that may start a call marker: not streamed yet
    opened: bool = False  # the calls' marker (or llama3's opening JSON) is in the text


@dataclass(frozen=True)
class ToolFormat:
    name: str
    marker: str | None  # the text that opens the calls (None: llama3's bare JSON)
    args_key: str
    separator: str
    special_marker: bool  # the marker is a special token: decode without skipping special tokens

    def scan(self, text: str) -> Scan:
        start = self._calls_start(text)
        if start is None:
            return Scan(text, [], self._held(text))
        calls: list[ScannedCall] = []
        pos = start
        while (m := _NAME.search(text, pos)) is not None:
            try:
                name = json.loads(f'"{m.group(1)}"')
            except ValueError:
                break
            a = _ARGS.search(text, m.end())
            if a is None:
                calls.append(ScannedCall(name, ""))
                break
            try:
                _, end = _DECODER.raw_decode(text, a.end())
            except ValueError:  # still open (or broken): what is there so far
                calls.append(ScannedCall(name, text[a.end():].rstrip()))
                break
            calls.append(ScannedCall(name, text[a.end():end]))
            pos = end
        return Scan(text[:start], calls, 0, opened=True)

    def partial_name(self, text: str) -> str | None:
        """The start of a call's name where the text ends inside it (`{"name": "get_we`)."""
        start = self._calls_start(text)
        m = _PARTIAL_NAME.search(text, start) if start is not None else None
        return m.group(1) if m is not None else None

    def _calls_start(self, text: str) -> int | None:
        if self.marker is not None:
            index = text.find(self.marker)
            return None if index < 0 else index
        stripped = text.lstrip()
        if stripped.startswith("<|python_tag|>") or stripped.startswith("{"):
            return len(text) - len(stripped)
        return None

    def _held(self, text: str) -> int:
        """Characters at the end of text that could still become the start of the calls."""
        if self.marker is None:
            return len(text) if not text.strip() or "<|python_tag|>".startswith(text.lstrip()) else 0
        for n in range(min(len(self.marker) - 1, len(text)), 0, -1):
            if self.marker.startswith(text[-n:]):
                return n
        return 0

    def structural_tag(self, tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
        """The grammar (xgrammar's structural tag) for one or more calls of these tools, nothing else."""
        def schema(tool: dict[str, Any]) -> dict[str, Any]:
            return tool["function"].get("parameters") or {"type": "object", "properties": {}}

        if self.name == "mistral":
            items = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                       "arguments": schema(t)},
                      "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
            array = {"type": "array", "items": {"anyOf": items}, "minItems": 1, **({} if parallel else {"maxItems": 1})}
            body = {"type": "sequence", "elements": [{"type": "const_string", "value": self.marker},
                                                     {"type": "json_schema", "json_schema": array,
                                                      "max_whitespace_cnt": 1}]}
            return {"type": "structural_tag", "format": body}
        begin = "<tool_call>\n" if self.name == "hermes" else ""
        end = "}\n</tool_call>" if self.name == "hermes" else "}"
        tags = [{"type": "tag", "begin": f'{begin}{{"name": {json.dumps(t["function"]["name"])}, "{self.args_key}": ',
                 "content": {"type": "json_schema", "json_schema": schema(t), "max_whitespace_cnt": 1}, "end": end}
                for t in tools]
        return {"type": "structural_tag", "format": {"type": "tags_with_separator", "tags": tags,
                                                     "separator": self.separator, "at_least_one": True,
                                                     "stop_after_first": not parallel}}


FORMATS = {
    "hermes": ToolFormat("hermes", "<tool_call>", "arguments", "\n", special_marker=False),
    "llama3": ToolFormat("llama3", None, "parameters", "; ", special_marker=True),
    "mistral": ToolFormat("mistral", "[TOOL_CALLS]", "arguments", ", ", special_marker=True),
}


def format_for_template(chat_template: str | None) -> ToolFormat:
    """The family whose markers the chat template writes; hermes when it names none."""
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return FORMATS["mistral"]
    if "<|python_tag|>" in template or "ipython" in template:
        return FORMATS["llama3"]
    return FORMATS["hermes"]
