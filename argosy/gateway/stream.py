"""Output guardrails over OpenAI responses: whole bodies, and SSE streams event by event.

Only used when a model has output checks: then each event's text is decoded, passed through a
StreamGuard per choice, and the event re-encoded with the text that is safe to release.
"""

from __future__ import annotations

import json

from argosy.gateway.guardrails import Guardrails, StreamGuard


def _text_slot(choice: dict) -> tuple[dict, str] | None:
    """The dict and key holding a choice's text (chat delta/message content, or completions text)."""
    for holder_key in ("delta", "message"):
        h = choice.get(holder_key)
        if isinstance(h, dict):
            return h, "content"
    if "text" in choice:
        return choice, "text"
    return None


def _tool_slots(choice: dict) -> list[tuple[dict, str]]:
    """Each tool call's arguments in a chat delta or message: (the function dict, the call's stream key).
    Guardrails read arguments as text, as they read content."""
    holder = choice.get("delta") or choice.get("message")
    calls = holder.get("tool_calls") if isinstance(holder, dict) else None
    slots = []
    for j, call in enumerate(calls if isinstance(calls, list) else []):
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            slots.append((function, f"tool{call.get('index', j)}"))
    return slots


async def rewrite_full(g: Guardrails, body: bytes) -> bytes:
    obj = json.loads(body)
    changed = False
    for ch in obj.get("choices", []):
        slot = _text_slot(ch)
        slots = ([slot] if slot else []) + [(f, "arguments") for f, _ in _tool_slots(ch)]
        for holder, key in slots:
            if isinstance(holder.get(key), str):
                new = await g.check_output(holder[key])
                if new != holder[key]:
                    holder[key] = new
                    changed = True
    return json.dumps(obj).encode() if changed else body


class StreamFilter:
    def __init__(self, g: Guardrails):
        self.g = g
        self.pending = b""
        self.guards: dict[int, StreamGuard] = {}
        self.template: dict | None = None  # the last event seen, to build a flush event from

    async def feed(self, chunk: bytes) -> bytes:
        self.pending += chunk
        *events, self.pending = self.pending.split(b"\n\n")
        out = []
        for ev in events:
            if not ev.startswith(b"data: "):
                out.append(ev + b"\n\n")
                continue
            data = ev[6:]
            if data.strip() == b"[DONE]":
                out.append(await self._flush_all())
                out.append(ev + b"\n\n")
                continue
            obj = json.loads(data)
            keep = False
            for ch in obj.get("choices", []):
                keep = await self._tool_calls(ch) or keep
                g = self.guards.setdefault(ch.get("index", 0), StreamGuard(self.g))
                slot = _text_slot(ch)
                text = slot[0].get(slot[1]) if slot else None
                if isinstance(text, str):
                    released = g.feed(text)
                    if ch.get("finish_reason") is not None:
                        released += await g.finish()
                        del self.guards[ch.get("index", 0)]
                    slot[0][slot[1]] = released
                    keep = keep or bool(released) or ch.get("finish_reason") is not None or len(slot[0]) > 1
                else:
                    keep = True
            if not obj.get("choices"):
                keep = True  # usage-only and other events pass unchanged
            self.template = obj
            if keep:
                out.append(b"data: " + json.dumps(obj).encode() + b"\n\n")
        return b"".join(out)

    async def _tool_calls(self, ch: dict) -> bool:
        """Guards each call's streamed arguments like content; at the choice's finish, what is still held is
        released in a tool_calls delta of that chunk. True when the event carries tool calls."""
        index = ch.get("index", 0)
        slots = _tool_slots(ch)
        for function, key in slots:
            guard = self.guards.setdefault((index, key), StreamGuard(self.g))
            function["arguments"] = guard.feed(function["arguments"])
        if ch.get("finish_reason") is None:
            return bool(slots)
        for guard_key, guard in list(self.guards.items()):
            if isinstance(guard_key, tuple) and guard_key[0] == index:
                key = guard_key[1]
                del self.guards[guard_key]
                rest = await guard.finish()
                if rest:
                    delta = ch.setdefault("delta", {})
                    delta.setdefault("tool_calls", []).append({"index": int(key[4:]), "function": {"arguments": rest}})
                    slots.append((delta, key))
        return bool(slots)

    async def _flush_all(self) -> bytes:
        out = []
        for idx, g in list(self.guards.items()):
            text = await g.finish()
            if text and self.template is not None:
                obj = dict(self.template)
                if isinstance(idx, tuple):  # a tool call's arguments
                    call = {"index": int(idx[1][4:]), "function": {"arguments": text}}
                    obj["choices"] = [{"index": idx[0], "finish_reason": None, "delta": {"tool_calls": [call]}}]
                    out.append(b"data: " + json.dumps(obj).encode() + b"\n\n")
                    continue
                ch = {"index": idx, "finish_reason": None}
                if any("delta" in c for c in self.template.get("choices", [])):
                    ch["delta"] = {"content": text}
                else:
                    ch["text"] = text
                obj["choices"] = [ch]
                out.append(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.guards.clear()
        return b"".join(out)
