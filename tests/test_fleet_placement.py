"""Placement: a table of nodes, GPUs and models in, placements (or reasons) out."""

from __future__ import annotations

import json

import pytest

from argosy.config import EngineSection, NodeConfig, parse_fleet
from argosy.fleet.placement import GPU, Need, Node, Placer, Unplaceable, detect_nodes, place_all, replica_need


def gpu_node(name: str, *gib: float) -> Node:
    return Node(name, "local", [GPU(i, "H100", g) for i, g in enumerate(gib)])


CASES = [
    # (nodes, wanted [(id, model, Need)], expected {id: (node, gpus)}, unplaceable ids)
    pytest.param([gpu_node("a", 80, 80)], [("x", "m", Need(1, 30)), ("y", "m", Need(1, 30))],
                 {"x": ("a", (0,)), "y": ("a", (1,))}, set(), id="one node, two gpus"),
    pytest.param([gpu_node("a", 80), gpu_node("b", 80)], [("x", "m", Need(1, 20)), ("y", "m", Need(1, 20))],
                 {"x": ("a", (0,)), "y": ("b", (0,))}, set(), id="same model spreads over nodes"),
    pytest.param([gpu_node("a", 80), gpu_node("b", 40)], [("x", "m", Need(1, 35)), ("y", "n", Need(1, 70))],
                 {"y": ("a", (0,)), "x": ("b", (0,))}, set(), id="best fit decreasing: big one first"),
    pytest.param([gpu_node("a", 24, 80)], [("x", "m", Need(1, 20))], {"x": ("a", (0,))}, set(),
                 id="best fit: the tightest gpu"),
    pytest.param([gpu_node("a", 80, 80)], [("x", "m", Need(1, 30)), ("y", "n", Need(1, 30)),
                                           ("z", "m", Need(1, 20))],
                 {"x": ("a", (0,)), "y": ("a", (0,)), "z": ("a", (1,))}, set(),
                 id="other models pack, copies of one model spread over gpus"),
    pytest.param([gpu_node("a", 80, 80)], [("x", "m", Need(2, 50))], {"x": ("a", (0, 1))}, set(), id="tp=2"),
    pytest.param([gpu_node("a", 80), gpu_node("b", 80)], [("x", "m", Need(2, 50))], {}, {"x"},
                 id="tp=2 never split across nodes"),
    pytest.param([gpu_node("a", 80)], [("x", "m", Need(1, 50)), ("y", "m", Need(1, 50))], {"x": ("a", (0,))},
                 {"y"}, id="never oversubscribed"),
    pytest.param([gpu_node("a", 80, 80)], [("x", "m", Need(1, float("inf"))), ("y", "m", Need(1, 10)),
                                           ("z", "m", Need(1, float("inf")))],
                 {"x": ("a", (0,)), "z": ("a", (1,))}, {"y"}, id="whole-gpu replicas first"),
    pytest.param([Node("cpu", memory_gib=8)], [("x", "m", Need(0, 3)), ("y", "m", Need(0, 3)),
                                               ("z", "m", Need(0, 3))],
                 {"x": ("cpu", ()), "y": ("cpu", ())}, {"z"}, id="cpu replicas by RAM"),
]


@pytest.mark.parametrize("nodes, wanted, expected, failed", CASES)
def test_placement_table(nodes, wanted, expected, failed):
    placed, reasons = place_all(nodes, wanted)
    assert {k: (p.node, p.gpus) for k, p in placed.items()} == expected
    assert set(reasons) == failed
    for r in reasons.values():
        assert r.startswith("m:") and ("GiB" in r or "GPUs on one node" in r)


def test_release_frees_the_memory_and_reasons_are_specific():
    placer = Placer([gpu_node("a", 80)])
    placer.place("x", "m", Need(1, 60))
    with pytest.raises(Unplaceable, match=r"1 GPU\(s\) with 30.00 GiB free each; free GiB per GPU: a: 20.0"):
        placer.place("y", "m", Need(1, 30))
    placer.release("x")
    assert placer.place("y", "m", Need(1, 30)).gpus == (0,)
    with pytest.raises(Unplaceable, match="needs 4 GPUs on one node; the largest node"):
        placer.place("z", "m", Need(4, 1))
    with pytest.raises(Unplaceable, match="no live node for provider 'ray'"):
        placer.place("w", "m", Need(1, 1), provider="ray")


def test_replica_need_from_config_json(tmp_path):
    # A 7B-shaped Llama: ~6.7e9 parameters, bf16 on the GPU -> ~12.5 GiB of weights.
    cfg = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 32, "vocab_size": 32000, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    need = replica_need(tmp_path, EngineSection(kv_cache_memory_gib=20), on_gpu=True)
    assert need.gpus == 1 and 33 < need.gib < 34.5  # 12.55 weights + 20 KV + 1 overhead
    tp2 = replica_need(tmp_path, EngineSection(kv_cache_memory_gib=20, tensor_parallel_size=2), on_gpu=True)
    assert tp2.gpus == 2 and 16.5 < tp2.gib < 17.5
    cpu = replica_need(tmp_path, EngineSection(kv_cache_memory_gib=1), on_gpu=False)
    assert cpu.gpus == 0 and 26 < cpu.gib < 27  # float32 on the CPU
    assert replica_need(tmp_path, EngineSection(), on_gpu=True).gib == float("inf")


def test_nodes_from_the_fleet_file():
    fleet = parse_fleet({"nodes": [{"name": "g", "gpus": [{"model": "A100", "memory_gib": 40}] * 2},
                                   {"name": "c", "memory_gib": 64}]})
    nodes = detect_nodes(fleet.nodes)
    assert [(n.name, len(n.gpus), n.memory_gib) for n in nodes] == [("g", 2, float("inf")), ("c", 0, 64)]
    assert isinstance(fleet.nodes[0], NodeConfig)
    local = detect_nodes(None)
    assert len(local) == 1 and local[0].name == "local" and local[0].memory_gib > 0


def test_custom_resources_only_on_nodes_that_offer_them():
    a = Node("a", "ray", memory_gib=64, resources={"argosy_node_type_a": 2})
    b = Node("b", "ray", memory_gib=64)
    placer = Placer([a, b])
    need = Need.of(0, 4, {"argosy_node_type_a": 1})
    assert need.resources == (("argosy_node_type_a", 1),)
    assert placer.place("x", "m", need, "ray").node == "a"
    assert placer.place("y", "m", need, "ray").node == "a"  # spreading never picks a node without them
    assert a.used_resources == {"argosy_node_type_a": 2}
    with pytest.raises(Unplaceable, match=r"needs resources \{argosy_node_type_a: 1\}; all in use on .*\(a\)"):
        placer.place("z", "m", need, "ray")
    placer.release("x")
    assert placer.place("z", "m", need, "ray").node == "a"
    with pytest.raises(Unplaceable, match="needs resources {type_c: 0.5}; no live node of provider 'ray' offers"):
        placer.place("w", "n", Need.of(0, 1, {"type_c": 0.5}), "ray")
    assert placer.place("v", "n", Need(0, 1), "ray").node == "a"  # no requirement: any node (a fits best)
    # Memory reasons name only the nodes that have the resources.
    with pytest.raises(Unplaceable, match="needs 100.00 GiB of RAM; the most free is 64.00 GiB on a"):
        Placer([Node("a", "ray", memory_gib=64, resources={"t": 1}), Node("b", "ray", memory_gib=500)]).place(
            "u", "m", Need.of(0, 100, {"t": 1}), "ray")


def test_fleet_file_node_resources_are_offered():
    fleet = parse_fleet({"providers": {"ray": {}}, "nodes": [
        {"name": "a", "provider": "ray", "memory_gib": 8, "resources": {"argosy_node_type_a": 1}},
        {"name": "b", "provider": "ray", "memory_gib": 8}]})
    placed, failed = place_all(detect_nodes(fleet.nodes), [("x", "m", Need.of(0, 1, {"argosy_node_type_a": 1})),
                                                           ("y", "m", Need.of(0, 1, {"argosy_node_type_a": 1}))])
    assert {k: p.node for k, p in placed.items()} == {"x": "a"} and set(failed) == {"y"}


RAY_TABLE = [
    {"NodeID": "h" * 56, "Alive": True, "NodeName": "10.0.0.1", "NodeManagerAddress": "10.0.0.1",
     "NodeManagerHostname": "box1", "Resources": {"CPU": 8, "head": 1, "node:10.0.0.1": 1}},
    {"NodeID": "w" * 56, "Alive": True, "NodeName": "gpu-a", "NodeManagerAddress": "10.0.0.2",
     "NodeManagerHostname": "box2", "Resources": {"CPU": 8, "GPU": 2, "argosy_node_type_a": 4, "node:10.0.0.2": 1}},
    {"NodeID": "d" * 56, "Alive": False, "NodeName": "old", "NodeManagerAddress": "10.0.0.3",
     "NodeManagerHostname": "box3", "Resources": {"old": 1}},
]


@pytest.mark.parametrize("name, resources, node_id, why", [
    ("head", {}, "h" * 56, ""),  # a custom resource named after the node
    ("gpu-a", {"argosy_node_type_a": 2}, "w" * 56, ""),  # ray start --node-name
    ("10.0.0.2", {}, "w" * 56, ""),  # IP (node:<ip>)
    ("box1", {}, "h" * 56, ""),  # hostname
    ("old", {}, None, "no live Ray node"),  # dead nodes never match
    ("gpu-a", {"argosy_node_type_a": 8}, None, "offers less than"),
    ("CPU", {}, None, "2 live Ray nodes match it (ambiguous)"),
])
def test_fleet_file_nodes_bind_to_live_ray_nodes(name, resources, node_id, why):
    from argosy.fleet.ray_provider import match_node

    got, reason = match_node(Node(name, "ray", resources=resources), RAY_TABLE)
    assert got == node_id and why in reason


class FakeRay:
    def __init__(self, table):
        self.table = table

    def nodes(self):
        return self.table


def test_ray_provider_skips_lost_listed_nodes_and_rebinds_them(monkeypatch):
    import asyncio

    from argosy.fleet.ray_provider import RayProvider

    fake = FakeRay([dict(n) for n in RAY_TABLE])
    prov = RayProvider()
    monkeypatch.setattr(prov, "_ray", lambda: fake)
    asyncio.run(prov.bind([Node("head", "ray"), Node("gpu-a", "ray"), Node("nowhere", "ray")]))
    assert prov.node_ids == {"head": "h" * 56, "gpu-a": "w" * 56} and set(prov.unbound) == {"nowhere"}
    assert prov.down_nodes() == {"nowhere"}
    fake.table[1]["Alive"] = False  # the gpu-a node is lost
    assert prov.down_nodes() == {"nowhere", "gpu-a"}
    fake.table.append({**RAY_TABLE[1], "NodeID": "n" * 56})  # it comes back as a new Ray node
    assert prov.down_nodes() == {"nowhere"} and prov.node_ids["gpu-a"] == "n" * 56


def test_ray_actor_options_request_gpus_custom_resources_and_the_node():
    pytest.importorskip("ray")
    from argosy.fleet.placement import Placement
    from argosy.fleet.ray_provider import actor_options

    opts = actor_options(Placement("a", (0, 1), Need.of(2, 30, {"argosy_node_type_a": 1})), 1.0, "ab" * 28)
    assert opts["num_gpus"] == 2 and opts["num_cpus"] == 1.0 and opts["resources"] == {"argosy_node_type_a": 1}
    assert opts["scheduling_strategy"].node_id == "ab" * 28 and opts["scheduling_strategy"].soft is False
    assert "resources" not in actor_options(Placement("a", (), Need(0, 1)), 0.5, None)


def _check(tmp_path, fleet: dict) -> tuple[int, str, str]:
    import argparse
    import contextlib
    import io

    import yaml

    from argosy.engine.random_model import make_random_model
    from argosy.fleet.status import run_config

    ckpt = tmp_path / "ckpt"  # a checkpoint `argosy serve` would start (config check refuses what it would not)
    if not (ckpt / "config.json").exists():
        make_random_model(ckpt, size="tiny", vocab_size=256)
    for m in fleet.get("models", []):
        m.setdefault("checkpoint", str(ckpt))
    f = tmp_path / "fleet.yaml"
    f.write_text(yaml.safe_dump(fleet))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = run_config(argparse.Namespace(file=str(f)))
    return rc, out.getvalue(), err.getvalue()


def test_config_check_skips_placement_for_discovered_ray_nodes(tmp_path):
    small = {"device": "cpu", "kv_cache_memory_gib": 0.1}
    rc, out, err = _check(tmp_path, {"providers": {"ray": {}, "local": {}},
                                     "models": [{"name": "r", "provider": "ray", "engine": small},
                                                {"name": "l", "engine": small}]})
    assert rc == 0, err
    assert "ok (2 models, 2 managed, 1 nodes)" in out
    assert "models.r: placement not checked: provider 'ray' discovers its nodes at run time" in out
    # With nodes listed for ray, placement is checked on them (and local still gets this machine).
    fleet = {"providers": {"ray": {}, "local": {}}, "nodes": [{"name": "a", "provider": "ray", "memory_gib": 0.5}],
             "models": [{"name": "r", "provider": "ray", "engine": small}, {"name": "l", "engine": small}]}
    rc, out, err = _check(tmp_path, fleet)
    assert rc == 2 and "models.r: replica 1 of min_replicas cannot be placed: r: needs" in err, err
    fleet["nodes"][0]["memory_gib"] = 8
    rc, out, err = _check(tmp_path, fleet)
    assert rc == 0 and "ok (2 models, 2 managed, 2 nodes)" in out and "not checked" not in out, err


def test_config_check_places_each_pipeline_stage_on_a_node_of_its_own(tmp_path):
    engine = {"device": "cpu", "kv_cache_memory_gib": 0.1, "pipeline_parallel_size": 2}
    fleet = {"providers": {"kubernetes": {}},
             "nodes": [{"name": n, "provider": "kubernetes", "memory_gib": 8} for n in ("a", "b")],
             "models": [{"name": "m", "provider": "kubernetes", "pipeline_across_nodes": True, "engine": engine,
                         "autoscaling": {"min_replicas": 2}}]}
    rc, out, err = _check(tmp_path, fleet)
    assert rc == 0 and "ok (1 models, 1 managed, 2 nodes)" in out, err
    fleet["nodes"].pop()
    rc, out, err = _check(tmp_path, fleet)
    assert rc == 2 and "replica 1 of min_replicas cannot be placed" in err and "stage 2 of 2" in err, err


def test_status_shows_custom_resources_in_use():
    from argosy.fleet.status import render

    res = {"argosy_node_type_a": {"total": 4.0, "used": 1.0}, "node:10.0.0.1": {"total": 1.0, "used": 0.0}}
    node = {"name": "a", "provider": "ray", "gpus": [], "memory_gib": None, "used_gib": 0.0, "resources": res}
    assert render({"nodes": [node], "models": []}) == ("node a (ray): no GPU; 0.00 GiB RAM; "
                                                       "resources argosy_node_type_a 1/4")


def test_pipeline_stages_each_take_a_node_of_their_own_and_release_together():
    placer = Placer([gpu_node("a", 80, 80), gpu_node("b", 80, 80), gpu_node("c", 80, 80)])
    with pytest.raises(Unplaceable):  # tp=2 x pp=2: four GPUs on one node, which no node has
        placer.place("one", "m", Need(4, 30), "local")
    p = placer.place_stages("x", "m", Need(4, 30), 2, "local")
    assert p.need == Need(2, 30)  # per stage
    assert len({n for n, _ in p.parts()}) == 2 and all(g == (0, 1) for _, g in p.parts())
    used = {n.name: [g.used_gib for g in n.gpus] for n in placer.nodes.values()}
    assert sorted(used.values()) == [[0, 0], [30, 30], [30, 30]]
    with pytest.raises(Unplaceable, match="stage 2 of 2"):  # only the free node has room for a stage
        placer.place_stages("y", "m", Need(4, 60), 2, "local")
    assert {n.name: [g.used_gib for g in n.gpus] for n in placer.nodes.values()} == used  # nothing left held
    placer.release("x")
    assert all(g.used_gib == 0 for n in placer.nodes.values() for g in n.gpus)
    with pytest.raises(Unplaceable, match="stage 2 of 2"):  # two stages never share a node, however big
        Placer([gpu_node("big", 80, 80, 80, 80)]).place_stages("z", "m", Need(4, 30), 2, "local")


@pytest.mark.parametrize("model, why", [
    ({"provider": "local", "engine": {"pipeline_parallel_size": 2}}, "only the kubernetes provider"),
    ({"provider": "kubernetes"}, "pipeline_parallel_size of 2 or more"),
])
def test_pipeline_across_nodes_needs_kubernetes_and_stages(model, why):
    with pytest.raises(ValueError, match=why):
        parse_fleet({"models": [{"name": "m", "checkpoint": "/x", "pipeline_across_nodes": True, **model}]})


def test_config_check_says_a_checkpoint_with_traffic_is_not_run(tmp_path):
    """The fleet example's shape (a checkpoint and a traffic split) is a model Argosy only routes to: `config check`
    said ok and `argosy serve` started nothing, silently, and every request was a 503."""
    split = [{"revision": "v1", "weight": 90}, {"revision": "v2", "weight": 10}]
    small = {"device": "cpu", "kv_cache_memory_gib": 0.1}
    rc, out, err = _check(tmp_path, {"models": [{"name": "chat", "revision": "v1", "traffic": split},
                                                {"name": "run", "engine": small}]})
    assert rc == 0 and "ok (2 models, 1 managed" in out, err
    assert "models.chat: has a checkpoint, but `traffic` makes it a model Argosy only routes to" in out
    assert "revisions (v1, v2) have no upstream" in out and "models.run" not in out


def test_config_check_of_a_file_with_no_models_says_what_serve_runs(tmp_path):
    rc, out, err = _check(tmp_path, {"gateway": {"port": 8001}})
    assert rc == 0 and "ok (0 models" in out and "serves the default model (" in out, (out, err)


def test_status_leaves_a_stopped_revision_out_of_the_split():
    """After a blue-green the split said "v2 100%, v1 0%", v1 long drained and stopped."""
    from argosy.fleet.status import render

    replica = {"id": "m-3", "revision": "v2", "state": "ready", "pooled": False, "node": "a", "in_flight": 0,
               "age_s": 5.0, "cold_start_s": 1.0, "url": "http://127.0.0.1:1"}
    model = {"model": "m", "provider": "local", "desired": 1, "panic": False, "in_flight": 0, "queued": 0, "held": 0,
             "unplaceable": None, "stable": "v2", "revisions": {"v2": {"weight": 100.0}, "v1": {"weight": 0.0}},
             "replicas": [replica], "decisions": [], "recent_failures": []}
    assert "split" not in render({"nodes": [], "models": [model]})  # one revision left: no split to show
    model["replicas"].append({**replica, "id": "m-1", "revision": "v1", "state": "draining"})
    assert "split v2 100%, v1 0%" in render({"nodes": [], "models": [model]})  # while v1 still drains
