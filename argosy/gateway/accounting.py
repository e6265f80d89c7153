"""Per-key accounting of a finished request: the tokens it used, reconciled with what was reserved."""

from __future__ import annotations

import contextlib
import json
import re

from argosy.cost.prices import PriceBook
from argosy.gateway.bodies import ProxiedRequest
from argosy.gateway.components import ENCODER_PATHS, TOKENIZER_PATHS, usage_total
from argosy.gateway.keys import KeyRecord
from argosy.gateway.proxy import Call
from argosy.gateway.ratelimit import MemoryLimiter, RedisLimiter


def key_class(key: KeyRecord | None) -> str:
    """The metrics label of a key: its priority class, never the key ("none" when the fleet has no keys)."""
    return key.priority if key is not None else "none"


_STREAM_USAGE = re.compile(r'"usage"\s*:\s*(?=\{)')
_DECODER = json.JSONDecoder()


def stream_usage(tail: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens from a stream's usage chunk, when it is among its last chunks."""
    text = tail.decode(errors="replace")
    found = list(_STREAM_USAGE.finditer(text))
    with contextlib.suppress(ValueError, KeyError, TypeError, IndexError):
        usage, _ = _DECODER.raw_decode(text, found[-1].end())  # it may hold objects (prompt_tokens_details)
        return int(usage["prompt_tokens"]), int(usage["completion_tokens"])
    return None


def tokens_used(call: Call, req: ProxiedRequest) -> tuple[int, int]:
    """(input, output) tokens: the response's usage (non-streamed), about one output token per streamed event,
    nothing for a failed call or a tokenizer route (no model ran)."""
    if req.path in TOKENIZER_PATHS:
        return 0, 0
    if call.stream:
        usage = stream_usage(call.before_last + call.last)  # exact with stream_options.include_usage
        if usage is not None:
            return usage
        framing = 2 if req.path == "/v1/chat/completions" else 1  # [DONE], and chat's first chunk (the role)
        return req.prompt_tokens, max(0, call.completion_events - framing)  # else about one token per event
    if call.output and call.status == 200 and req.path in ENCODER_PATHS:
        return usage_total(call.output) or req.prompt_tokens, 0  # an encoder: input only; usage read from the tail
    if call.output and call.status == 200:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            usage = json.loads(b"".join(call.output))["usage"]
            prompt = int(usage.get("prompt_tokens", req.prompt_tokens))
            return prompt, int(usage.get("completion_tokens") or int(usage["total_tokens"]) - prompt)
        return req.prompt_tokens, req.estimate - req.prompt_tokens
    return (0, 0) if call.status != 200 else (req.prompt_tokens, req.estimate - req.prompt_tokens)


async def account(limiter: MemoryLimiter | RedisLimiter, key: KeyRecord | None, call: Call,
                  req: ProxiedRequest, prices: PriceBook | None = None, kind: str | None = None) -> None:
    """Reconcile the tokens-per-minute bucket with the real usage, and count the request, its input and output
    tokens and its spend (the price book's served_prices: $ per million tokens, so tokens x rate is micro-$)."""
    if key is None:
        return
    prompt, completion = tokens_used(call, req)
    used = prompt + completion
    if key.tpm:
        await limiter.adjust(key.name, key.tpm, min(req.estimate, key.tpm) - used)
    rate = prices.served(call.model) if prices is not None else None
    spend = round(prompt * rate.input_usd_per_mtok + completion * rate.output_usd_per_mtok) if rate else 0
    by_kind = {f"{kind}_tokens": used} if kind in ("embed", "rerank") else {}  # encoders' tokens, billed apart
    await limiter.count(key.name, 1, used, input_tokens=prompt, output_tokens=completion, spend_micro_usd=spend,
                        **by_kind)
