"""Every `exchange_interval_s`, each region's gateway POSTs its state to every other one and reads theirs
in the answer: per model, whether it has a live replica, requests in flight, capacity (live replicas x
per-replica concurrency), saturation threshold and $/h per replica. Both directions are signed.

The round trip of each exchange (on a kept-alive connection) is the measured latency to that region: the
median of the last RTT_SAMPLES. A failed exchange counts against every model of that region (outlier
detection); a state saying a model has no live replica there takes that region out for the model at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping

import aiohttp

from argosy.gateway.regions.service import Regions

log = logging.getLogger("argosy.gateway")
PATH = "/regions/exchange"
RTT_SAMPLES = 5


class RegionExchange:
    def __init__(self, regions: Regions, runtimes: Callable[[], Mapping], session: Callable[[], aiohttp.ClientSession]):
        self.regions, self.runtimes, self.session = regions, runtimes, session
        self.rtts: dict[str, deque[float]] = {p.name: deque(maxlen=RTT_SAMPLES) for p in regions.peers()}
        self.last_error: dict[str, str] = {}
        self.task: asyncio.Task | None = None
        self.rounds = 0
        self.prices: Callable[[str], float | None] = lambda model: None  # the controller's, under argosy serve

    # ------------------------------------------------------------------ own state

    def state(self) -> dict:
        out = {}
        for name, rt in self.runtimes().items():
            live = self.regions.observe_home(rt)
            home = self.regions.models[name].home
            if live:
                home.health.ok()
            price = self.prices(name)
            if price is not None:
                home.usd_per_hour = price
            out[name] = {"healthy": live and home.allowed, "in_flight": home.estimated_in_flight(),
                         "capacity": home.capacity, "spill_at": home.spill_at, "usd_per_hour": home.usd_per_hour}
        return {"region": self.regions.name, "models": out}

    def take(self, region: str, state: dict) -> None:
        """A region's state (from an exchange answer, or from its own call here)."""
        models = state.get("models") if isinstance(state, dict) else None
        if not isinstance(models, dict):
            return
        for name, mr in self.regions.models.items():
            u = mr.by_region.get(region)
            if u is None:
                continue
            s = models.get(name)
            if not isinstance(s, dict) or not s.get("healthy"):
                u.health.fail(at_once=True)
                continue
            try:
                u.report(float(s["in_flight"]), float(s["capacity"]), float(s["spill_at"]), float(s["usd_per_hour"]))
            except (KeyError, TypeError, ValueError):
                u.health.fail(at_once=True)
                continue
            u.health.ok()

    def failed(self, region: str, why: str) -> None:
        if self.last_error.get(region) != why:
            log.warning("regions: exchange with %s failed: %s", region, why)
        self.last_error[region] = why
        for mr in self.regions.models.values():
            u = mr.by_region.get(region)
            if u is not None:
                u.health.fail()

    # ------------------------------------------------------------------ the loop

    async def exchange_with(self, peer, body: bytes) -> None:
        signer = self.regions.signer
        headers = {"content-type": "application/json", **signer.sign("POST", PATH, body)}
        timeout = aiohttp.ClientTimeout(total=self.regions.cfg.exchange_timeout_s)
        t0 = time.monotonic()
        try:
            async with self.session().post(peer.gateway + PATH, data=body, headers=headers, timeout=timeout) as r:
                answer = await r.read()
                rtt = time.monotonic() - t0
                if r.status != 200:
                    return self.failed(peer.name, f"HTTP {r.status}: {answer[:200]!r}")
                sender = signer.verify({k.lower(): v for k, v in r.headers.items()}, "ANSWER", PATH, answer)
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            return self.failed(peer.name, type(e).__name__)
        except Exception as e:  # a bad signature (GatewayError) or a broken answer
            return self.failed(peer.name, str(e)[:200])
        if sender != peer.name:
            return self.failed(peer.name, f"answered as {sender!r}")
        self.last_error.pop(peer.name, None)
        samples = self.rtts[peer.name]
        samples.append(rtt)
        median = statistics.median(samples)
        for mr in self.regions.models.values():
            if (u := mr.by_region.get(peer.name)) is not None:
                u.rtt_s = median
        try:
            self.take(peer.name, json.loads(answer))
        except ValueError:
            self.failed(peer.name, "an answer that is not JSON")

    async def round(self) -> None:
        body = json.dumps(self.state()).encode()
        await asyncio.gather(*(self.exchange_with(p, body) for p in self.regions.peers()))
        self.rounds += 1

    async def run(self) -> None:
        while True:
            try:
                await self.round()
            except Exception:  # one bad round must not end the exchange
                log.exception("regions: exchange round failed")
            await asyncio.sleep(self.regions.cfg.exchange_interval_s)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    # ------------------------------------------------------------------ the other side of an exchange

    def answer(self, headers: Mapping[str, str], body: bytes) -> tuple[bytes, dict[str, str]]:
        """A peer's signed state in; our state and the signature headers out (raises 401 if unsigned)."""
        sender = self.regions.signer.verify(headers, "POST", PATH, body)
        if sender in self.rtts:
            with contextlib.suppress(ValueError):
                self.take(sender, json.loads(body))
        out = json.dumps(self.state()).encode()
        return out, self.regions.signer.sign("ANSWER", PATH, out)
