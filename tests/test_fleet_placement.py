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
