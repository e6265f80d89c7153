"""API keys added, rotated or revoked at run time (the admin API, `argosy keys`), shared by every gateway
on one Redis (`gateway.redis_url`).

Redis holds the added keys' records (hashes only, never a key) and the names revoked at run time (a
fleet-file key too). A change bumps a version and is published; every gateway reloads and then writes the
version it applied under its own id. The admin call that made the change waits until every live gateway
has applied it (at most WAIT_S), so when `argosy keys revoke` returns, no gateway accepts the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from argosy.gateway.keys import KeyRecord, KeyStore

log = logging.getLogger("argosy.gateway")
WAIT_S = 3.0


class KeySync:
    def __init__(self, redis, store: KeyStore, fleet_keys: list[KeyRecord], gid: str, prefix: str = "argosy:"):
        self.r, self.store, self.gid, self.p = redis, store, gid, prefix
        self.fleet_keys = {k.name: k for k in fleet_keys}
        self.channel = f"{prefix}keys:changed"
        self.task: asyncio.Task | None = None
        self.applied = 0

    async def start(self) -> None:
        self.pubsub = self.r.pubsub()
        await self.pubsub.subscribe(self.channel)
        await self.reload()
        self.task = asyncio.get_running_loop().create_task(self._listen())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        with contextlib.suppress(Exception):
            await self.r.delete(f"{self.p}keys:applied:{self.gid}")
            await self.pubsub.aclose()

    async def reload(self) -> None:
        """The fleet file's keys, less those revoked, plus those added at run time."""
        pipe = self.r.pipeline(transaction=False)
        pipe.get(f"{self.p}keys:version")
        pipe.hgetall(f"{self.p}keys:added")
        pipe.smembers(f"{self.p}keys:revoked")
        version, added, revoked = await pipe.execute()
        revoked_names = {n.decode() for n in revoked}
        runtime = [KeyRecord.from_json(v) for v in added.values()]
        replaced = {k.name for k in runtime}  # a rotated fleet-file key lives on under its new hash
        records = [k for n, k in self.fleet_keys.items() if n not in revoked_names and n not in replaced]
        records += runtime
        self.store.replace_all(records)
        self.applied = int(version or 0)
        await self.r.set(f"{self.p}keys:applied:{self.gid}", self.applied, ex=3600)

    async def _listen(self) -> None:
        async for msg in self.pubsub.listen():
            if msg.get("type") != "message":
                continue
            try:
                await self.reload()
            except Exception as e:  # redis hiccup: the next change reloads everything again
                log.warning("reloading keys from redis failed: %s", e)

    async def put(self, record: KeyRecord) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(f"{self.p}keys:added", record.name, record.to_json())
        pipe.srem(f"{self.p}keys:revoked", record.name)
        pipe.incr(f"{self.p}keys:version")
        await self._publish(pipe)

    async def revoke(self, name: str) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.hdel(f"{self.p}keys:added", name)
        pipe.sadd(f"{self.p}keys:revoked", name)
        pipe.incr(f"{self.p}keys:version")
        await self._publish(pipe)

    async def _publish(self, pipe) -> None:
        version = (await pipe.execute())[-1]
        await self.r.publish(self.channel, str(version))
        await self.reload()  # this gateway at once, whatever the channel's delay
        await self._wait_applied(version)

    async def _wait_applied(self, version: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            gids = [g.decode() for g in await self.r.smembers(f"{self.p}gateways")]
            pipe = self.r.pipeline(transaction=False)
            for g in gids:
                pipe.get(f"{self.p}keys:applied:{g}")
                pipe.exists(f"{self.p}inflight:{g}")  # a live gateway refreshes this key
            values = await pipe.execute()
            behind = [g for g, applied, alive in zip(gids, values[::2], values[1::2], strict=True)
                      if alive and int(applied or 0) < version]
            if not behind:
                return
            await asyncio.sleep(0.01)
        log.warning("key change %d not confirmed by every gateway within %.0f s", version, WAIT_S)
