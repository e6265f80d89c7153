"""Upstream state: the gateway's own load accounting, scraped vllm:* gauges and a circuit breaker.

Breaker: closed -> (eject_after consecutive failures, passive or active) -> open for `eject_for_s`
-> half-open: one probe request at a time -> closed on success, open again on failure. A breaker
opened by failing health checks alone also closes on a passing check after the cooldown; one opened
by failing requests needs a request to succeed (a passing /health does not prove requests work).
Load counts are updated at once when a request starts/ends, never scraped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

import aiohttp

from argosy.gateway.scraper import ReplicaScraper

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class Upstream:
    __slots__ = ("url", "in_flight", "tokens_in_flight", "remote_in_flight", "waiting", "kv_usage",
                 "state", "failures", "opened_at", "probing", "passive", "eject_after", "eject_for", "served", "failed")

    reply_headers: tuple[tuple[bytes, bytes], ...] = ()  # headers the caller gets when it answers (regions)

    def __init__(self, url: str, eject_after: int = 3, eject_for: float = 5.0):
        self.url = url
        self.in_flight = 0  # this gateway's requests in flight here
        self.tokens_in_flight = 0  # their estimated tokens
        self.remote_in_flight = 0  # other gateways' (via redis), refreshed every shared_sync_s
        self.waiting = 0.0  # scraped vllm:num_requests_waiting
        self.kv_usage = 0.0  # scraped vllm:kv_cache_usage_perc (0..1)
        self.state, self.failures, self.opened_at, self.probing = CLOSED, 0, 0.0, False
        self.passive = False  # whether a failing request (not only health checks) opened the breaker
        self.eject_after, self.eject_for = eject_after, eject_for
        self.served = self.failed = 0

    @property
    def total_in_flight(self) -> int:
        return self.in_flight + self.remote_in_flight

    def load(self) -> float:
        """Requests on this upstream: in flight from this gateway and the others (via Redis), plus those
        waiting in the replica's own queue (scraped vllm:num_requests_waiting; it also counts traffic no
        gateway sent). One unit, requests: a queued request a gateway sent counts twice, so an upstream
        that queues weighs more than one running as many. KV usage is the kv_cache scorer's."""
        return self.total_in_flight + self.waiting

    def available(self, now: float | None = None) -> bool:
        if self.state == CLOSED:
            return True
        if self.state == OPEN:
            now = time.monotonic() if now is None else now
            return now - self.opened_at >= self.eject_for
        return not self.probing  # half-open: one probe at a time

    def on_start(self, tokens: int) -> None:
        if self.state == OPEN:  # cooldown over (available() said so): this request is the probe
            self.state = HALF_OPEN
        if self.state == HALF_OPEN:
            self.probing = True
        self.in_flight += 1
        self.tokens_in_flight += tokens

    def on_end(self, tokens: int) -> None:
        self.in_flight -= 1
        self.tokens_in_flight -= tokens

    def success(self) -> None:
        self.failures, self.probing, self.state, self.passive = 0, False, CLOSED, False
        self.served += 1

    def failure(self, passive: bool = True) -> None:
        self.passive = self.passive or passive
        self.failed += 1
        self.failures += 1
        self.probing = False
        if self.state == HALF_OPEN or self.failures >= self.eject_after:
            if self.state != OPEN or not passive:  # each failing health check restarts the cooldown: no
                self.opened_at = time.monotonic()  # request is sent to probe an upstream known to be down
            self.state = OPEN

    def snapshot(self) -> dict:
        return {"url": self.url, "state": self.state, "healthy": self.state == CLOSED, "in_flight": self.in_flight,
                "remote_in_flight": self.remote_in_flight, "tokens_in_flight": self.tokens_in_flight,
                "waiting": self.waiting, "kv_cache_usage": self.kv_usage, "consecutive_failures": self.failures,
                "served": self.served, "failed": self.failed}


class HealthChecker:
    """Active checks: GET /health (any answer below 500 means alive: llama.cpp's server has no
    /health), then the replica's load gauges through the scraper for the URLs `scrape()` names each round."""

    def __init__(self, session: aiohttp.ClientSession, interval: float, timeout: float, scraper: ReplicaScraper):
        self.session, self.interval, self.scraper = session, interval, scraper
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.task: asyncio.Task | None = None

    async def check(self, u: Upstream, scrape: bool) -> bool:
        try:
            async with self.session.get(u.url + "/health", timeout=self.timeout) as r:
                await r.read()
                ok = r.status < 500
            if ok and scrape:
                await self.scraper.scrape(u.url)  # a replica that cannot serve /metrics fails the check
        except (TimeoutError, aiohttp.ClientError, OSError):
            ok = False
        if ok:
            if u.state != CLOSED and not u.passive and u.available():
                u.failures, u.probing, u.state = 0, False, CLOSED  # recovered: passing check closes it
        else:
            u.failure(passive=False)
        return ok

    async def run(self, upstreams: Callable[[], Iterable[Upstream]], scrape: Callable[[], set[str]]) -> None:
        """Each round checks every upstream, and scrapes those whose URL `scrape()` names at that round:
        replicas join and leave the routing sets while the gateway runs."""
        while True:
            ups = list(upstreams())
            wanted = scrape()
            await asyncio.gather(*(self.check(u, u.url in wanted) for u in ups), return_exceptions=True)
            await asyncio.sleep(self.interval)

    def start(self, upstreams: Callable[[], Iterable[Upstream]], scrape: Callable[[], set[str]]) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run(upstreams, scrape))

    async def stop(self) -> None:
        if self.task:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
