"""A proxied request's body as the gateway reads it (ProxiedRequest), and where the prompt text lives in
an OpenAI request body: for routing, token estimates and guardrails."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from argosy.gateway.components import ENCODER_PATHS, TOKENIZER_PATHS, encoder_prompt, set_encoder_texts
from argosy.gateway.limits import parse_json
from argosy.gateway.validation import check_body


@dataclass
class ProxiedRequest:
    """The fields of one OpenAI request the gateway reads; the body goes upstream as received (unless an
    input guardrail rewrote a prompt)."""
    path: str
    body: bytes
    fields: dict[str, Any]
    model: str
    stream: bool
    user: str | None
    text: str  # the prompt as routing sees it
    prompt_tokens: int  # estimated (exact for token ids)
    texts: list[str]  # what input guardrails check
    estimate: int  # prompt + completion tokens: what limits reserve and load counts

    @classmethod
    def parse(cls, path: str, body: bytes, default_max_tokens: int) -> ProxiedRequest:
        """Parse and check (validation.check_body) before anything acts on the body: a 400 otherwise."""
        req = parse_json(body)  # strict: no NaN or Infinity, no lone surrogates; too deep or not UTF-8: a 400
        check_body(path, req)
        text, ptoks, texts = prompt_of(path, req)
        max_toks = req.get("max_tokens") or req.get("max_completion_tokens") or default_max_tokens
        est = ptoks + (int(max_toks) * completions(path, req) if path not in ENCODER_PATHS | TOKENIZER_PATHS else 0)
        stream = bool(req.get("stream")) and path not in TOKENIZER_PATHS  # they answer JSON whatever is asked
        return cls(path, body, req, req["model"], stream, req.get("user") or None, text, ptoks,
                   texts, est)

    def set_texts(self, texts: list[str]) -> None:
        """Guardrails redacted the prompt: the body sent upstream carries the new texts."""
        set_texts(self.path, self.fields, texts)
        self.body = json.dumps(self.fields).encode()


def completions(path: str, req: dict) -> int:
    """How many completions a generation asks for: n for each prompt (what tokens per minute reserve)."""
    prompt = req.get("prompt") if path == "/v1/completions" else None
    prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    return int(req.get("n") or 1) * prompts


def prompt_of(path: str, req: dict) -> tuple[str, int, list[str]]:
    """(routing text, estimated prompt tokens, the texts input guardrails see)."""
    if path in TOKENIZER_PATHS:
        return "", 0, []
    if path in ENCODER_PATHS:  # embeddings and rerank (a cross-encoder's estimate: Gateway.model_for)
        return encoder_prompt(path, req, "embed")
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
    if path in ENCODER_PATHS:
        return set_encoder_texts(path, req, texts)
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
