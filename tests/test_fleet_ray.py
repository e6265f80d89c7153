"""The Ray provider on a real two-node Ray cluster (a head and a worker, separate raylet processes):
the fleet file's nodes are bound to the Ray nodes by name (a custom resource), replicas are placed on
both and request their model's custom resources, and a replica on a node that dies is replaced on the
other (the placer skips the lost node)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from argosy.config import parse_fleet
from argosy.fleet.replica import READY
from tests.fleet_fixtures import serve_in_process, tiny_fleet, wait_until

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.timeout(240)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def cluster(monkeypatch):
    """A head and a worker node, each a `ray start --block` process (ending it ends its node)."""
    tmp = tempfile.mkdtemp(prefix="argosy-ray-")  # short: Ray's socket paths live under it
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED"):
        monkeypatch.setenv(k, env[k])
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    port = _free_port()
    common = ["--block", "--node-ip-address=127.0.0.1", "--num-cpus=2", "--disable-usage-stats"]
    t0 = time.monotonic()
    procs = [subprocess.Popen([ray_bin, "start", "--head", f"--port={port}", "--include-dashboard=false",
                               f"--temp-dir={tmp}/ray", *common, '--resources={"head": 1, "argosy_slot": 2}'],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() - t0 < 60 and procs[0].poll() is None, "ray head did not start"
            time.sleep(0.2)
        procs.append(subprocess.Popen([ray_bin, "start", f"--address=127.0.0.1:{port}", *common,
                                       '--resources={"worker": 1, "argosy_slot": 1}'], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        ray.init(address=f"127.0.0.1:{port}", _node_ip_address="127.0.0.1", log_to_driver=False)
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            assert time.monotonic() - t0 < 90, "ray worker did not join"
            time.sleep(0.2)
        print(f"  ray cluster with two nodes up in {time.monotonic() - t0:.1f} s", flush=True)
        yield procs[1]
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def test_replicas_on_both_nodes_and_a_lost_node_is_replaced(cluster, tiny_llama):
    cfg = tiny_fleet(tiny_llama, min_replicas=2, max_replicas=2, tick_s=0.5)
    cfg["providers"] = {"ray": {"num_cpus": 1}}  # the driver is already connected (ray.init above)
    cfg["models"][0]["provider"] = "ray"
    # Bound by name to the Ray nodes with the custom resources `head` and `worker`.
    cfg["nodes"] = [{"name": "head", "provider": "ray", "resources": {"argosy_slot": 2}},
                    {"name": "worker", "provider": "ray", "resources": {"argosy_slot": 1}}]
    cfg["models"][0]["resources"] = {"argosy_slot": 1}  # each replica takes one slot
    worker_id = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "worker" in n["Resources"])
    asyncio.run(_scenario(parse_fleet(cfg), cluster, worker_id))


async def _scenario(fleet, worker_proc, worker_id: str) -> None:
    from argosy.fleet.ray_provider import RayProvider

    found = {n.name: n for n in await RayProvider().nodes()}  # discovery, without fleet-file nodes
    assert found["ray-" + worker_id[:8]].resources["argosy_slot"] == 1 and len(found) == 2, found
    async with serve_in_process(fleet) as (app, client):
        mc = app.controller.models["tiny"]
        ready = lambda: [r for r in mc.replicas.values() if r.state == READY]  # noqa: E731
        await wait_until("two ready replicas", lambda: len(ready()) == 2, timeout=120)
        assert {r.node for r in ready()} == {"head", "worker"}  # one on each node
        assert app.controller.providers["ray"].node_ids["worker"] == worker_id
        worker_name = "worker"
        # Each actor holds one argosy_slot (3 in the cluster).
        await wait_until("two argosy_slots in use", lambda: ray.available_resources().get("argosy_slot", 0) == 1, 30)
        for _ in range(4):
            r = await client.completions.create(model="tiny", prompt="Hi", max_tokens=4)
            assert r.choices[0].text
        lost = next(r for r in ready() if r.node == worker_name)
        worker_proc.terminate()  # the worker node ends, its actors and their engines with it
        await wait_until("a replacement on the head node",
                         lambda: len(ready()) == 2 and all(r.node != worker_name for r in ready()), timeout=120)
        assert lost.id not in mc.replicas and any(f["id"] == lost.id for f in mc.recent_failures)
        assert "worker" in app.controller.providers["ray"].down_nodes()
        r = await client.completions.create(model="tiny", prompt="Hi", max_tokens=4)
        assert r.choices[0].text
