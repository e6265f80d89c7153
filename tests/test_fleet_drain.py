"""In-process controller and gateway (one event loop, as in `argosy serve`) with real replicas: the warm
pool takes traffic the moment it is needed, and a drained replica finishes its stream before it stops."""

from __future__ import annotations

import asyncio
import socket
import time

import openai
import pytest
import uvicorn

from argosy.config import parse_fleet
from argosy.fleet.replica import READY
from argosy.fleet.serve import ServeApp
from tests.fleet_fixtures import tiny_fleet

pytestmark = pytest.mark.timeout(180)


async def wait(what: str, cond, timeout: float = 90.0) -> None:
    t0 = last = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        if time.monotonic() - last > 1:
            print(f"  [{time.monotonic() - t0:5.1f} s] waiting for {what}", flush=True)
            last = time.monotonic()
        await asyncio.sleep(0.1)


def test_warm_pool_promotion_and_drain_never_cuts_a_stream(tiny_llama):
    # tick_s is long: this test drives reconcile/drain itself; the loop only ticks at start (and when poked).
    fleet = parse_fleet(tiny_fleet(tiny_llama, warm_pool=1, tick_s=600, min_replicas=1, max_replicas=2))
    asyncio.run(_scenario(fleet))


async def _scenario(fleet) -> None:
    app = ServeApp(fleet)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    try:
        await wait("the server", lambda: server.started)
        mc = app.controller.models["tiny"]
        rt = app.gateway.models["tiny"]
        routed = lambda: {u.url for r in rt.routers.values() for u in r.upstreams}  # noqa: E731
        reps = lambda pooled: [r for r in mc.replicas.values() if r.pooled == pooled]  # noqa: E731
        await wait("one routed and one pooled ready replica",
                   lambda: [r.state for r in reps(False)] == [READY] and [r.state for r in reps(True)] == [READY])
        pooled = reps(True)[0]
        assert pooled.url not in routed()  # warm, but not in the routing set

        stream = await client.completions.create(model="tiny", prompt="Tell me", max_tokens=400, stream=True,
                                                 extra_body={"ignore_eos": True})
        first = await stream.__anext__()
        assert first.choices
        mc.reconcile(2)  # scale up: the pooled replica is routed at once, no cold start
        assert pooled.url in routed() and not pooled.pooled

        busy = next(r for r in reps(False) if mc._in_flight(r) == 1)
        drain = asyncio.get_running_loop().create_task(mc.drain(busy))
        await asyncio.sleep(0.05)
        assert busy.url not in routed() and busy.state == "draining"  # no new requests from now on
        other = await client.completions.create(model="tiny", prompt="Hi", max_tokens=4)
        assert other.choices[0].text
        assert not drain.done()  # still waiting for the stream
        chunks = [first] + [c async for c in stream]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["length"], "the drained replica's stream was cut"
        assert len(chunks) > 200  # all of it (some tokens carry no text on their own)
        await asyncio.wait_for(drain, 30)
        assert busy.handle.returncode is not None and busy.id not in mc.replicas
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 60)
        await client.close()
    for r in list(mc.replicas.values()):
        assert r.handle is None or r.handle.returncode is not None
