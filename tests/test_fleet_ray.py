"""The Ray provider on a real two-node Ray cluster (a head and a worker, separate raylet processes):
replicas are placed on both nodes, and a replica on a node that dies is replaced on the other."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import time

import openai
import pytest
import uvicorn

from argosy.config import parse_fleet
from argosy.fleet.replica import READY
from argosy.fleet.serve import ServeApp
from tests.fleet_fixtures import tiny_fleet

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture()
def cluster(monkeypatch):
    tmp = tempfile.mkdtemp(prefix="argosy-ray-")  # short: Ray's socket paths live under it
    os.makedirs(os.path.join(tmp, "ray"))
    for k, v in dict(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=tmp).items():
        monkeypatch.setenv(k, v)
    common = dict(num_cpus=2, node_ip_address="127.0.0.1")
    t0 = time.monotonic()
    c = Cluster(initialize_head=True, head_node_args=dict(include_dashboard=False, temp_dir=os.path.join(tmp, "ray"),
                                                                **common))
    worker = c.add_node(**common)
    print(f"  ray cluster with two nodes up in {time.monotonic() - t0:.1f} s", flush=True)
    try:
        yield c, worker
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


async def wait(what: str, cond, timeout: float = 120.0) -> None:
    t0 = last = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        if time.monotonic() - last > 2:
            print(f"  [{time.monotonic() - t0:5.1f} s] waiting for {what}", flush=True)
            last = time.monotonic()
        await asyncio.sleep(0.2)


def test_replicas_on_both_nodes_and_a_lost_node_is_replaced(cluster, tiny_llama):
    c, worker = cluster
    cfg = tiny_fleet(tiny_llama, min_replicas=2, max_replicas=2, tick_s=0.5)
    cfg["providers"] = {"ray": {"address": c.address, "num_cpus": 1}}
    cfg["models"][0]["provider"] = "ray"
    asyncio.run(_scenario(parse_fleet(cfg), c, worker))


async def _scenario(fleet, c, worker) -> None:
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
        ready = lambda: [r for r in mc.replicas.values() if r.state == READY]  # noqa: E731
        await wait("two ready replicas", lambda: len(ready()) == 2)
        nodes = {r.node for r in ready()}
        worker_name = "ray-" + worker.node_id[:8]
        assert len(nodes) == 2 and worker_name in nodes, nodes  # one on each node
        for _ in range(4):
            r = await client.completions.create(model="tiny", prompt="Hi", max_tokens=4)
            assert r.choices[0].text
        lost = next(r for r in ready() if r.node == worker_name)
        c.remove_node(worker)  # the worker's raylet and its actors die: the replica with them
        await wait("a replacement on the head node",
                   lambda: len(ready()) == 2 and all(r.node != worker_name for r in ready()))
        assert lost.id not in mc.replicas and any(f["id"] == lost.id for f in mc.recent_failures)
        r = await client.completions.create(model="tiny", prompt="Hi", max_tokens=4)
        assert r.choices[0].text
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 60)
        await client.close()
