"""The scheduler extender over HTTP, fed recorded kube-scheduler requests (ExtenderArgs with full Node
objects of mixed GPUs: 2 x H100 80 GB, 1 x A10 24 GB, 1 x L40S 48 GB; one with nodenames only)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import httpx
import pytest

from argosy.fleet.scheduler_extender import Extender, make_app
from tests.fleet_fixtures import ROOT

DATA = ROOT / "tests" / "data" / "extender"


@pytest.fixture
def extender():
    from aiohttp import web

    ext, ready, box = Extender(), threading.Event(), {}
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]

    def run() -> None:
        async def main() -> None:
            runner = web.AppRunner(make_app(ext))
            await runner.setup()
            await web.SockSite(runner, sock).start()
            box["stop"] = asyncio.Event()
            ready.set()
            await box["stop"].wait()
            await runner.cleanup()

        box["loop"] = asyncio.new_event_loop()
        box["loop"].run_until_complete(main())

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(10)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        yield ext, client
    box["loop"].call_soon_threadsafe(box["stop"].set)
    t.join(10)


def recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def filter_(client, name: str) -> dict:
    r = client.post("/filter", json=recorded(name))
    assert r.status_code == 200, r.text
    return r.json()


def kept(result: dict) -> list[str]:
    if "nodenames" in result:
        return result["nodenames"]
    return [n["metadata"]["name"] for n in result["nodes"]["items"]]


def scores(client, name: str) -> dict[str, int]:
    r = client.post("/prioritize", json=recorded(name))
    assert r.status_code == 200, r.text
    return {h["host"]: h["score"] for h in r.json()}


def bind(client, name: str, node: str) -> None:
    pod = recorded(name)["pod"]["metadata"]
    r = client.post("/bind", json={"podName": pod["name"], "podNamespace": pod["namespace"], "podUID": pod["uid"],
                                   "node": node})
    assert r.status_code == 200 and r.json() == {"error": ""}, r.text


def test_filter_keeps_the_nodes_that_fit_and_says_why_the_others_do_not(extender):
    _, client = extender
    res = filter_(client, "filter-big-60gib.json")
    assert kept(res) == ["h100-a"]
    assert set(res["failedNodes"]) == {"a10-b", "l40s-c"}
    assert "60.00 GiB free" in res["failedNodes"]["a10-b"] and "22.5" in res["failedNodes"]["a10-b"]
    res = filter_(client, "filter-huge-100gib.json")
    assert kept(res) == [] and set(res["failedNodes"]) == {"h100-a", "a10-b", "l40s-c"}
    res = filter_(client, "filter-whole-2gpus.json")  # nodenames only (nodeCacheCapable): whole GPUs
    assert res["nodenames"] == ["h100-a"] and "needs 2 GPUs" in res["failedNodes"]["a10-b"]
    res = filter_(client, "filter-not-argosy.json")  # not an Argosy pod: every node stays
    assert kept(res) == ["h100-a", "a10-b", "l40s-c"] and res["failedNodes"] == {}


def test_prioritize_prefers_the_tightest_fit(extender):
    _, client = extender
    assert kept(filter_(client, "filter-qwen-30gib.json")) == ["h100-a", "l40s-c"]
    s = scores(client, "filter-qwen-30gib.json")
    assert s["l40s-c"] == 10 and s["h100-a"] < s["l40s-c"] and s["a10-b"] == 0
    assert all(0 <= v <= 10 for v in s.values())


def test_two_models_pack_on_one_gpu(extender):
    ext, client = extender
    filter_(client, "filter-llama70b-30gib.json")
    bind(client, "filter-llama70b-30gib.json", "h100-a")
    # 30 GiB of the H100's 79.6 are taken: another 30 GiB model still fits on that same GPU.
    assert "h100-a" in kept(filter_(client, "filter-qwen-30gib.json"))
    bind(client, "filter-qwen-30gib.json", "h100-a")
    (_, llama), (_, qwen) = ext.bound["uid-argosy-llama-70b-r1-a1b2"], ext.bound["uid-argosy-qwen-r3-e5f6"]
    assert llama.node == qwen.node == "h100-a" and llama.gpus == qwen.gpus  # packed: one GPU, two models
    # With 19.6 GiB left on that GPU and 79.6 on the other, a 60 GiB model now fits only on the other one.
    assert kept(filter_(client, "filter-big-60gib.json")) == ["h100-a"]
    bind(client, "filter-big-60gib.json", "h100-a")
    assert ext.bound["uid-argosy-big-r4-a7b8"][1].gpus != llama.gpus
    res = filter_(client, "filter-big-60gib.json")  # and now nowhere
    assert kept(res) == [] and "h100-a" in res["failedNodes"]


def test_a_second_replica_spreads_to_a_node_without_its_model(extender):
    _, client = extender
    filter_(client, "filter-small-10gib.json")
    bind(client, "filter-small-10gib.json", "a10-b")
    # The A10 has 12.5 GiB left: the tightest fit for another 10 GiB replica, but it holds this model.
    assert "a10-b" in kept(filter_(client, "filter-small-second-10gib.json"))
    s = scores(client, "filter-small-second-10gib.json")
    assert s["l40s-c"] == 10 and s["a10-b"] == 0 and 0 < s["h100-a"] < 10


def test_bad_requests_get_a_json_error(extender):
    _, client = extender
    r = client.post("/filter", content=b"{not json")
    assert r.status_code == 400 and "not JSON" in r.json()["error"]
    r = client.post("/bind", json={"podName": "x", "podNamespace": "y", "podUID": "z", "node": "h100-a"})
    assert "was not filtered here" in r.json()["error"]
