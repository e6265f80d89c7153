"""State shared by gateways through Redis (with `gateway.redis_url`): the prefix index and the
in-flight counts. (Rate limits and usage counters use Redis directly: ratelimit.RedisLimiter.)

Prefix inserts are published on a channel and applied by every other gateway, so affinity holds
whichever gateway a request lands on. In-flight counts: each gateway publishes its own per-upstream
counts every `shared_sync_s` under a key that expires (a crashed gateway's counts vanish) and reads
the others'; its own count stays exact and immediate, the others' lag by at most one period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

log = logging.getLogger("argosy.gateway")
CHANNEL = "argosy:prefix"


class Shared:
    def __init__(self, redis, registry, index, period: float, prefix: str = "argosy:"):
        self.r, self.reg, self.index, self.period, self.p = redis, registry, index, period, prefix
        self.gid = uuid.uuid4().hex[:12]
        self.tasks: list[asyncio.Task] = []
        self.pending: list[bytes] = []

    async def start(self) -> None:
        await self.r.ping()
        self.pubsub = self.r.pubsub()
        await self.pubsub.subscribe(CHANNEL)
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._sync_loop()), loop.create_task(self._listen())]

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        with contextlib.suppress(Exception):  # bounded: a gateway stops even when Redis is gone
            async with asyncio.timeout(1.0):
                await self.r.delete(f"{self.p}inflight:{self.gid}")
                await self.r.srem(f"{self.p}gateways", self.gid)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self.pubsub.aclose()

    # ---- prefix index
    def publish_prefix(self, hashes: list[bytes], url: str) -> None:
        # Batched: one PUBLISH per event-loop turn however many requests were routed in it.
        if not self.pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self.pending.append(self.gid.encode() + b"\n" + url.encode() + b"\n" + b"".join(hashes))

    def _flush(self) -> None:
        msgs, self.pending = self.pending, []
        t = asyncio.get_running_loop().create_task(self._publish(msgs))
        t.add_done_callback(lambda t: t.cancelled() or t.exception())  # never "exception not retrieved"

    async def _publish(self, msgs: list[bytes]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for m in msgs:
            pipe.publish(CHANNEL, m)
        async with asyncio.timeout(1.0):  # lost while Redis is away: the index is a routing hint
            await pipe.execute()

    async def _listen(self) -> None:
        """Other gateways' prefix inserts; resubscribes after Redis comes back."""
        me = self.gid.encode()
        while True:
            try:
                async for msg in self.pubsub.listen():
                    if msg.get("type") != "message":
                        continue
                    try:
                        gid, url, blob = msg["data"].split(b"\n", 2)
                    except ValueError:
                        continue
                    if gid != me:
                        self.index.insert([blob[i:i + 8] for i in range(0, len(blob), 8)], url.decode())
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("redis prefix channel lost (%s); resubscribing", type(e).__name__)
            await asyncio.sleep(1.0)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self.pubsub.aclose()
            try:
                self.pubsub = self.r.pubsub()
                async with asyncio.timeout(1.0):
                    await self.pubsub.subscribe(CHANNEL)
            except Exception:  # still away: next round
                continue

    # ---- in-flight counts
    async def _sync_loop(self) -> None:
        key, members = f"{self.p}inflight:{self.gid}", f"{self.p}gateways"
        ttl_ms = int(self.period * 5000) + 1000
        failing = False
        while True:
            try:
                counts = {u.url: u.in_flight for u in self.reg.by_url.values()}
                pipe = self.r.pipeline(transaction=False)
                pipe.delete(key)
                if counts:
                    pipe.hset(key, mapping=counts)
                pipe.pexpire(key, ttl_ms)
                pipe.sadd(members, self.gid)
                pipe.smembers(members)
                async with asyncio.timeout(1.0):
                    gids = (await pipe.execute())[-1]
                others = [g.decode() for g in gids if g.decode() != self.gid]
                remote: dict[str, int] = {}
                if others:
                    pipe = self.r.pipeline(transaction=False)
                    for g in others:
                        pipe.hgetall(f"{self.p}inflight:{g}")
                    async with asyncio.timeout(1.0):
                        hashes = await pipe.execute()
                    for g, h in zip(others, hashes, strict=True):
                        if not h:
                            await self.r.srem(members, g)  # expired: that gateway is gone
                        for url, n in h.items():
                            remote[url.decode()] = remote.get(url.decode(), 0) + int(n)
                for u in self.reg.by_url.values():
                    u.remote_in_flight = remote.get(u.url, 0)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # redis hiccup: keep serving on local counts (said once per outage)
                if not failing:
                    log.warning("redis in-flight sync failed (%s); routing on this gateway's counts", e)
                failing = True
            else:
                failing = False
            await asyncio.sleep(self.period)
