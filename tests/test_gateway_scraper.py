"""The one replica scraper: prometheus_client parses, results are shared (one fetch per replica however
many ask at once, reused while fresh), and every result reaches the routing state through its callback."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from argosy.gateway.scraper import ReplicaScraper, parse_gauges

METRICS = ('# HELP vllm:num_requests_waiting Requests waiting.\n# TYPE vllm:num_requests_waiting gauge\n'
           'vllm:num_requests_waiting{model_name="a"} 3.0\nvllm:num_requests_waiting{model_name="b"} 1.0\n'
           'vllm:num_requests_running{model_name="a"} 2.0\nvllm:kv_cache_usage_perc{model_name="a"} 0.25\n'
           'vllm:num_requests_waiting_total 9.0\n')


def test_parse_gauges_sums_label_sets_and_keeps_what_came_before_a_bad_line():
    assert parse_gauges(METRICS) == {"waiting": 4.0, "running": 2.0, "kv_usage": 0.25}
    broken = 'vllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc{model_name="a" 0.5\n'
    assert parse_gauges(broken.encode()) == {"waiting": 2.0}
    assert parse_gauges(b"") == {}


def test_one_fetch_per_replica_shared_by_concurrent_callers_and_reused_while_fresh():
    async def scenario() -> None:
        hits = []

        async def metrics(request: web.Request) -> web.Response:
            hits.append(request.path)
            await asyncio.sleep(0.05)  # callers arrive while the fetch is under way
            return web.Response(text=METRICS)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        dead = "http://127.0.0.1:1"
        seen = []
        async with aiohttp.ClientSession() as session:
            scraper = ReplicaScraper(lambda: session, 2.0, lambda u, g: seen.append((u, g.waiting)))
            got = await asyncio.gather(scraper.refresh([url, dead]), scraper.refresh([url]),
                                       scraper.scrape(url))
            assert len(hits) == 1  # three callers, one GET
            assert got[0][url].waiting == 4.0 and got[0][url].running == 2.0 and dead not in got[0]
            assert got[2].kv_usage == 0.25
            assert seen == [(url, 4.0)]
            await scraper.refresh([url], max_age=60)
            assert len(hits) == 1  # fresh enough: reused
            await scraper.refresh([url])
            assert len(hits) == 2
            scraper.forget(url)
            assert scraper.get(url) is None
        await runner.cleanup()

    asyncio.run(scenario())
