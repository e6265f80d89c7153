"""Fault-matrix scenarios at the gateway: misbehaving upstreams, Redis killed and restarted under two
gateways, and ten times the capacity. Each runs steady load through real gateway processes, injects
its fault, and returns the counting client's Tally (tests/load_counter.py). The CI test runs them
short (`seconds`); bench/reliability/fault_matrix.py runs them longer, beside the replica scenarios.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable

from argosy.gateway.keys import new_key
from tests.fake_upstreams import FakeUpstream
from tests.gateway_fixtures import start_gateway, start_redis
from tests.load_counter import CountingClient, Tally

# Timeouts short enough that a scenario sees them fire; health checks often enough to eject quickly.
GATEWAY = {"first_byte_timeout_s": 2.0, "idle_read_timeout_s": 1.5, "health_interval_s": 0.5,
           "health_timeout_s": 1.0, "eject_for_s": 3.0}
Fault = Callable[[list[CountingClient], Tally], Awaitable[None]]


def run_load(targets: list[tuple[str, dict]], tally: Tally, fault: Fault, model: str = "m") -> Tally:
    """Steady load on each (url, client options) until `fault` (which injects and waits) returns."""
    async def main() -> None:
        clients = [CountingClient(url, model, tally, **opts) for url, opts in targets]
        for c in clients:
            c.start()
        try:
            await fault(clients, tally)
        finally:
            for c in clients:
                await c.stop()
    asyncio.run(main())
    return tally


def upstream_goes_bad(behaviour: str, seconds: float = 10.0) -> Tally:
    """Two upstreams take traffic in turn; one of them starts to `behaviour` (health checks included)."""
    good, bad = FakeUpstream("ok", delay=0.02), FakeUpstream("ok", delay=0.02, whole=True)
    gw = start_gateway({"gateway": GATEWAY, "models": [{"name": "m", "upstreams": [good.url, bad.url],
                                                        "routing": {"policy": "round_robin"}}]})

    async def fault(clients, tally):
        await asyncio.sleep(2)
        bad.behaviour, tally.fault_at = behaviour, time.monotonic()
        await asyncio.sleep(seconds)

    names = {"silent": "accepts and never answers", "garbage": "answers garbage",
             "close_headers": "closes mid-headers", "trickle": "trickles a byte a second",
             "stall_stream": "goes silent mid-stream"}
    try:
        tally = run_load([(gw.url, {"workers": 4})], Tally(f"upstream {names[behaviour]}"), fault)
        tally.survivors_up = gw.popen.poll() is None
        return tally
    finally:
        gw.stop()
        good.stop()
        bad.stop()


def redis_restarted_under_two_gateways(seconds: float = 8.0, pepper: bytes | None = None) -> Tally:
    """Two gateways share rate limits, the prefix index and in-flight counts in Redis; Redis is SIGKILLed
    under load and started again on the same port 3 s later."""
    pepper = pepper or os.environ["ARGOSY_KEY_PEPPER"].encode()
    key, h = new_key(pepper)
    redis, url = start_redis()
    port = url.rsplit(":", 1)[1].split("/")[0]
    ups = [FakeUpstream("ok", delay=0.02) for _ in range(2)]
    cfg = {"gateway": {**GATEWAY, "redis_url": url, "shared_sync_s": 0.1},
           "keys": [{"name": "k", "hash": h, "rpm": 100_000, "tpm": 10_000_000}],
           "models": [{"name": "m", "upstreams": [u.url for u in ups], "routing": {"policy": "prefix"}}]}
    gws = [start_gateway(cfg), start_gateway(cfg)]
    procs = [redis]

    async def fault(clients, tally):
        await asyncio.sleep(2)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        tally.fault_at = time.monotonic()
        await asyncio.sleep(3)
        procs[0] = (await asyncio.to_thread(start_redis, int(port)))[0]
        tally.healed_at = time.monotonic()
        await asyncio.sleep(seconds)

    try:
        tally = run_load([(g.url, {"workers": 2, "api_key": key}) for g in gws],
                         Tally("Redis killed and restarted under two gateways"), fault)
        tally.survivors_up = all(g.popen.poll() is None for g in gws)
        return tally
    finally:
        for g in gws:
            g.stop()
        for u in ups:
            u.stop()
        procs[0].kill()
        procs[0].wait(10)


def ten_times_capacity(seconds: float = 8.0, upstream_url: str | None = None, model: str = "m",
                       max_in_flight: int = 4, steady_workers: int = 2, max_tokens: int = 8,
                       upstream_key: str | None = None) -> Tally:
    """Capacity is `max_in_flight` requests at once; 10x that many clients arrive for `seconds`, then leave.
    Without `upstream_url`, a fake upstream taking 0.2 s a request stands in for the replicas."""
    fake = None if upstream_url else FakeUpstream("ok", delay=0.2)
    url = upstream_url or fake.url
    gw = start_gateway({"gateway": GATEWAY, "models": [{"name": model, "upstreams": [url], "admission": {
        "max_in_flight": max_in_flight, "max_queue": 2 * max_in_flight, "queue_timeout_s": 1.0}}]},
        env={"ARGOSY_UPSTREAM_API_KEY": upstream_key} if upstream_key else None)

    async def fault(clients, tally):
        await asyncio.sleep(2)
        surge = CountingClient(gw.url, model, tally, workers=10 * max_in_flight, pause_s=0.0, max_tokens=max_tokens)
        tally.fault_at = time.monotonic()
        surge.start()
        await asyncio.sleep(seconds)
        await surge.stop()
        tally.healed_at = time.monotonic()
        await asyncio.sleep(4)

    try:
        tally = run_load([(gw.url, {"workers": steady_workers, "max_tokens": max_tokens, "pause_s": 0.2})],
                         Tally(f"10x capacity for {seconds:g} s"), fault, model)
        tally.survivors_up = gw.popen.poll() is None
        return tally
    finally:
        gw.stop()
        if fake:
            fake.stop()
