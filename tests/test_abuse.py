"""Abuse, light (issue 15): idle connections, slow-loris heads and streams never read, at once (the
wrong-key flood is tests/test_gateway_keys.py's); a valid client's latency stays near its quiet value,
the gateway's memory stays bounded, and the abusers' connections and upstream streams are let go within
the configured timeouts. The full run: `python bench/reliability/abuse.py`."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
import pytest

from tests.abuse import Abuse, p99, rss_mib, summary, valid_latencies
from tests.gateway_fixtures import start_gateway, start_upstream

pytestmark = pytest.mark.timeout(180)


def upstream_in_flight(gw_url: str, url: str) -> int:
    models = httpx.get(gw_url + "/admin/upstreams", timeout=10).json()["models"]
    return sum(u["in_flight"] for m in models.values() for ups in m.values() for u in ups if u["url"] == url)


def test_abusive_clients_do_not_harm_a_valid_one():
    up = start_upstream("valid")
    big = start_upstream("endless", token_delay=0.002)  # 2 KiB events, 500 a second: for clients that never read
    big.control(text=" ".join(["x" * 2048] * 20_000))
    gw = start_gateway({"gateway": {"request_header_timeout_s": 2.0, "idle_read_timeout_s": 2.0},
                        "models": [{"name": "m", "upstreams": [up.url]}, {"name": "big", "upstreams": [big.url]}]})
    pid = gw.popen.pid
    try:
        async def main():
            quiet = await valid_latencies(gw.url, None, 40)
            rss0 = rss_mib(pid)
            idle, loris, readers = Abuse(gw.url), Abuse(gw.url), Abuse(gw.url)
            idle.idle(300)
            loris.slow_loris(100)
            readers.never_read(2, None, model="big")
            await asyncio.sleep(0.5)
            under = await valid_latencies(gw.url, None, 40)
            rss1 = rss_mib(pid)
            await asyncio.sleep(2.5)  # past the header timeout: idle and slow-loris connections are closed
            closed = idle.closed_by_server() + loris.closed_by_server()
            t0 = time.monotonic()
            while upstream_in_flight(gw.url, big.url) and time.monotonic() - t0 < 30:
                await asyncio.sleep(0.2)  # never-read streams let go of the upstream after the idle timeout
            streams_left = upstream_in_flight(gw.url, big.url)
            for a in (idle, loris, readers):
                await a.close()
            return quiet, under, rss0, rss1, closed, streams_left
        quiet, under, rss0, rss1, closed, streams_left = asyncio.run(main())
        print(f"quiet {summary(quiet)}; under abuse {summary(under)}; gateway RSS {rss0:.0f} -> {rss1:.0f} MiB; "
              f"abusive connections closed by the gateway {closed}/400; upstream streams left {streams_left}")
        assert statistics.median(under) <= 3 * statistics.median(quiet) + 0.005
        assert p99(under) <= 10 * p99(quiet) + 0.05
        assert rss1 - rss0 < 100
        assert closed >= 390  # idle and slow-loris sockets do not hold the gateway's descriptors for ever
        assert streams_left == 0  # a client that never reads does not hold an upstream stream
        assert gw.popen.poll() is None
    finally:
        gw.stop()
        up.stop()
        big.stop()
