"""Per-key requests-per-minute and tokens-per-minute token buckets, in memory or in Redis.

Tokens are estimated up front (prompt + max_tokens) and reconciled with the real usage afterwards.
In Redis one Lua script takes from both buckets atomically, on Redis's clock, so every gateway
sharing the Redis enforces the same limit (not limit x gateways).
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("argosy.gateway")
REDIS_TIMEOUT_S = 0.5  # longer, and a request goes on with this gateway's own buckets (see RedisLimiter)

TAKE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local function level(key, cap)
  local v = redis.call('HMGET', key, 'tokens', 'ts')
  local tok, ts = tonumber(v[1]), tonumber(v[2])
  if tok == nil then return cap end
  return math.min(cap, tok + (now - ts) * cap / 60)
end
local caps = {tonumber(ARGV[1]), tonumber(ARGV[2])}
local want = {1, tonumber(ARGV[3])}
local levels = {}
local wait = 0
for i = 1, 2 do
  if caps[i] > 0 then
    levels[i] = level(KEYS[i], caps[i])
    if levels[i] < want[i] then wait = math.max(wait, (want[i] - levels[i]) * 60 / caps[i]) end
  end
end
if wait > 0 then return math.ceil(wait * 1000) end
for i = 1, 2 do
  if caps[i] > 0 then
    redis.call('HSET', KEYS[i], 'tokens', tostring(levels[i] - want[i]), 'ts', tostring(now))
    redis.call('EXPIRE', KEYS[i], 120)
  end
end
return 0
"""

ADJUST_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local cap = tonumber(ARGV[1])
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tok, ts = tonumber(v[1]), tonumber(v[2])
if tok == nil then tok, ts = cap, now end
tok = math.min(cap, math.min(cap, tok + (now - ts) * cap / 60) + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'tokens', tostring(tok), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], 120)
return 0
"""


# embed_tokens, rerank_tokens: the tokens of requests to encoder models (kind embed, rerank), billed apart
USAGE_FIELDS = ("requests", "tokens", "input_tokens", "output_tokens", "spend_micro_usd", "embed_tokens",
                "rerank_tokens")


class MemoryLimiter:
    def __init__(self) -> None:
        self.buckets: dict[tuple[str, str], list[float]] = {}  # (key, kind) -> [level, ts]
        self.usage: dict[str, dict[str, int]] = {}

    def _level(self, name: str, kind: str, cap: int, now: float) -> float:
        b = self.buckets.get((name, kind))
        if b is None:
            return float(cap)
        return min(cap, b[0] + (now - b[1]) * cap / 60)

    async def take(self, name: str, rpm: int | None, tpm: int | None, tokens: int) -> float:
        """0 if admitted (both buckets debited), else the seconds until it would be."""
        now = time.monotonic()
        wait = 0.0
        levels = {}
        for kind, cap, want in (("rpm", rpm, 1), ("tpm", tpm, tokens)):
            if cap:
                levels[kind] = lv = self._level(name, kind, cap, now)
                if lv < want:
                    wait = max(wait, (want - lv) * 60 / cap)
        if wait > 0:
            return wait
        for kind, cap, want in (("rpm", rpm, 1), ("tpm", tpm, tokens)):
            if cap:
                self.buckets[(name, kind)] = [levels[kind] - want, now]
        return 0.0

    async def adjust(self, name: str, tpm: int | None, delta: int) -> None:
        """Give back (delta > 0) or charge (delta < 0) tokens once real usage is known."""
        if tpm:
            now = time.monotonic()
            self.buckets[(name, "tpm")] = [min(tpm, self._level(name, "tpm", tpm, now) + delta), now]

    async def count(self, name: str, requests: int, tokens: int, **split: int) -> None:
        """Usage counters: requests, tokens, and (split) input_tokens, output_tokens, spend_micro_usd."""
        u = self.usage.setdefault(name, dict.fromkeys(USAGE_FIELDS, 0))
        for field, n in {"requests": requests, "tokens": tokens, **split}.items():
            u[field] += n

    async def get_usage(self, name: str) -> dict[str, int]:
        return dict(self.usage.get(name, dict.fromkeys(USAGE_FIELDS, 0)))


class RedisLimiter:
    def __init__(self, redis, prefix: str = "argosy:") -> None:
        self.r, self.p = redis, prefix
        self._take = redis.register_script(TAKE_LUA)
        self._adjust = redis.register_script(ADJUST_LUA)
        self.fallback = MemoryLimiter()  # this gateway's own buckets while Redis is away
        self.down = False

    async def _redis(self, call):
        """The call's result, or raises _Unreachable (logged once per outage) within REDIS_TIMEOUT_S."""
        import redis.exceptions

        try:
            async with asyncio.timeout(REDIS_TIMEOUT_S):
                out = await call()
        except (TimeoutError, OSError, redis.exceptions.RedisError) as e:
            if not self.down:
                log.warning("redis unreachable (%s): rate limits fall back to this gateway's own buckets",
                            type(e).__name__)
            self.down = True
            raise _Unreachable from None
        if self.down:
            log.warning("redis reachable again: rate limits shared again")
            self.down = False
        return out

    async def take(self, name: str, rpm: int | None, tpm: int | None, tokens: int) -> float:
        try:
            ms = await self._redis(lambda: self._take(keys=[f"{self.p}rl:{name}:rpm", f"{self.p}rl:{name}:tpm"],
                                                      args=[rpm or 0, tpm or 0, tokens]))
        except _Unreachable:
            return await self.fallback.take(name, rpm, tpm, tokens)
        return int(ms) / 1000

    async def adjust(self, name: str, tpm: int | None, delta: int) -> None:
        if tpm and delta:
            try:
                await self._redis(lambda: self._adjust(keys=[f"{self.p}rl:{name}:tpm"], args=[tpm, delta]))
            except _Unreachable:
                await self.fallback.adjust(name, tpm, delta)

    async def count(self, name: str, requests: int, tokens: int, **split: int) -> None:
        pipe = self.r.pipeline(transaction=False)
        for field, n in {"requests": requests, "tokens": tokens, **split}.items():
            if n:
                pipe.hincrby(f"{self.p}usage:{name}", field, n)
        try:
            await self._redis(pipe.execute)
        except _Unreachable:
            await self.fallback.count(name, requests, tokens, **split)

    async def get_usage(self, name: str) -> dict[str, int]:
        try:
            v = await self._redis(lambda: self.r.hgetall(f"{self.p}usage:{name}"))
        except _Unreachable:
            return await self.fallback.get_usage(name)
        return {field: int(v.get(field.encode(), 0)) for field in USAGE_FIELDS}


class _Unreachable(Exception):
    pass
