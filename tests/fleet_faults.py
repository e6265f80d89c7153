"""Fault-matrix scenarios with `argosy serve`: the gateway restarted while its model is at zero replicas,
and the fleet controller killed under load. Each returns the counting client's Tally."""

from __future__ import annotations

import asyncio
import socket
import time

from tests.fault_scenarios import run_load
from tests.fleet_fixtures import Serve, ready, serve_in_process, tiny_fleet
from tests.load_counter import CountingClient, Tally


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gateway_restarted_at_zero(ckpt: str, seconds: float = 10.0) -> Tally:
    """`argosy serve` scales its model to zero; under load it is stopped (SIGTERM) and started again on
    the same port. While it is down, connections are refused (nothing accepted them); after, the first
    requests wait for the cold start."""
    fleet = tiny_fleet(ckpt, min_replicas=0, max_replicas=1, scale_to_zero_after_s=1.0)
    fleet["gateway"]["port"] = free_port()
    fleet["models"][0]["autoscaling"]["cold_start_timeout_s"] = 60
    serve = [Serve(fleet)]
    serve[0].wait_for("zero replicas", lambda st: not st["replicas"], timeout=60)

    async def fault(clients: list[CountingClient], tally: Tally) -> None:
        await asyncio.sleep(3)  # the first requests start a replica; let it serve a little
        tally.fault_at = time.monotonic()
        await asyncio.to_thread(serve[0].stop)
        serve[0] = await asyncio.to_thread(Serve, fleet)  # recovery counts from the SIGTERM: the whole outage
        await asyncio.sleep(seconds)

    try:
        tally = run_load([(serve[0].url, {"workers": 2, "max_tokens": 8, "timeout": 90.0, "pause_s": 0.2})],
                         Tally("gateway restarted while the model is at zero"), fault, "tiny")
        tally.survivors_up = serve[0].proc.poll() is None
        return tally
    finally:
        serve[0].stop()


def controller_killed(ckpt: str, seconds: float = 8.0) -> Tally:
    """`argosy serve`'s controller runs as tasks in the gateway's event loop: they are cancelled under
    load (as a crash of the controller would end them). The gateway keeps serving on the replicas it has."""
    from argosy.config import parse_fleet

    fleet = parse_fleet(tiny_fleet(ckpt, min_replicas=2, max_replicas=2))
    tally = Tally("fleet controller killed (its tasks cancelled)")

    async def main() -> None:
        async with serve_in_process(fleet) as (app, client):
            url = str(client.base_url).removesuffix("/v1/")
            mcs = list(app.controller.models.values())
            deadline = time.monotonic() + 120
            while sum(len(ready({"replicas": mc.status()["replicas"]})) for mc in mcs) < 2:
                assert time.monotonic() < deadline, "replicas did not start"
                await asyncio.sleep(0.2)
            load = CountingClient(url, "tiny", tally, workers=4, max_tokens=16)
            load.start()
            await asyncio.sleep(2)
            for mc in mcs:
                mc.task.cancel()
            tally.fault_at = time.monotonic()
            await asyncio.sleep(seconds)
            await load.stop()
    asyncio.run(main())
    return tally

