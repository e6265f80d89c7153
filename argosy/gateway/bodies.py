"""Where the prompt text lives in an OpenAI request body: for routing, token estimates and guardrails."""

from __future__ import annotations

import math


def prompt_of(path: str, req: dict) -> tuple[str, int, list[str]]:
    """(routing text, estimated prompt tokens, the texts input guardrails see)."""
    if path == "/v1/chat/completions":
        texts, parts = [], []
        for m in req.get("messages") or []:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, list):
                c = "".join(p.get("text", "") for p in c if isinstance(p, dict))
            c = c if isinstance(c, str) else ""
            texts.append(c)
            parts.append(f"{m.get('role')}\x1f{c}\x1e")
        text = "".join(parts)
        return text, math.ceil(len(text) / 4), texts
    p = req.get("prompt") if path == "/v1/completions" else req.get("input")
    if isinstance(p, list) and p and isinstance(p[0], int):  # token ids: exact count, digits for routing
        return ",".join(map(str, p)), len(p), []
    if isinstance(p, list):
        texts = [x for x in p if isinstance(x, str)]
        text = "\x1e".join(texts)
        return text, math.ceil(len(text) / 4), texts
    text = p if isinstance(p, str) else ""
    return text, math.ceil(len(text) / 4), [text]


def set_texts(path: str, req: dict, texts: list[str]) -> None:
    """Write (redacted) texts back where prompt_of found them."""
    it = iter(texts)
    if path == "/v1/chat/completions":
        for m in req.get("messages") or []:
            c = m.get("content")
            if isinstance(c, list):
                joined = next(it)
                c[:] = [{"type": "text", "text": joined}] + [p for p in c if p.get("type") != "text"]
            else:
                m["content"] = next(it)
        return
    field = "prompt" if path == "/v1/completions" else "input"
    p = req.get(field)
    req[field] = [next(it) if isinstance(x, str) else x for x in p] if isinstance(p, list) else next(it)
