"""Per-key accounting of a finished request: the tokens it used, reconciled with what was reserved."""

from __future__ import annotations

import contextlib
import json

from argosy.gateway.bodies import ProxiedRequest
from argosy.gateway.keys import KeyRecord
from argosy.gateway.proxy import Call
from argosy.gateway.ratelimit import MemoryLimiter, RedisLimiter


def key_class(key: KeyRecord | None) -> str:
    """The metrics label of a key: its priority class, never the key ("none" when the fleet has no keys)."""
    return key.priority if key is not None else "none"


def tokens_used(call: Call, req: ProxiedRequest) -> int:
    """The response's usage (non-streamed), about one token per streamed event, 0 for a failed call."""
    if call.stream:
        return req.prompt_tokens + max(0, call.completion_events - 1)  # ~one token per event, minus [DONE]
    if call.output and call.status == 200:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return int(json.loads(b"".join(call.output))["usage"]["total_tokens"])
        return req.estimate
    return 0 if call.status != 200 else req.estimate


async def account(limiter: MemoryLimiter | RedisLimiter, key: KeyRecord | None, call: Call,
                  req: ProxiedRequest) -> None:
    """Reconcile the tokens-per-minute bucket with the real usage, and count the request."""
    if key is None:
        return
    used = tokens_used(call, req)
    if key.tpm:
        await limiter.adjust(key.name, key.tpm, min(req.estimate, key.tpm) - used)
    await limiter.count(key.name, 1, used)
