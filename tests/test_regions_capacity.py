"""Capacity kinds in the controller without processes: placement order and units, the fallback of a
preempted spot replica (spot elsewhere, else on-demand), a provider's own preemption notices, and what
`argosy status` shows by region, provider and capacity kind."""

from __future__ import annotations

import asyncio

import pytest

from argosy.config import parse_fleet
from argosy.config_regions import region_view
from argosy.fleet.capacity import CapacityBook, summary
from argosy.fleet.placement import Need, Placer, Unplaceable, detect_nodes
from argosy.fleet.preemption import PreemptionNotice, Preemptions
from argosy.fleet.status import render


def fleet(order=None, **capacity) -> dict:
    cap = {"reserved": {"gpu": "H100", "count": 1, "usd_per_hour": 1.85},
           "on_demand": {"gpu": "H100", "count": 2, "usd_per_hour": 2.99},
           "spot": {"gpu": "H100", "count": 4, "usd_per_hour": 1.20}, **capacity}
    gpu = [{"model": "H100", "memory_gib": 80}]
    doc = {"regions": [{"name": "us", "provider": "lambda", "jurisdiction": "us", "gateway": "http://10.0.0.1:8000",
                        "capacity": cap,
                        "nodes": [{"name": "res", "capacity": "reserved", "gpus": gpu},
                                  {"name": "od-1", "capacity": "on_demand", "gpus": gpu},
                                  {"name": "od-2", "capacity": "on_demand", "gpus": gpu * 2},
                                  {"name": "spot-1", "capacity": "spot", "gpus": gpu},
                                  {"name": "spot-2", "capacity": "spot", "gpus": gpu}]}]}
    if order:
        doc["region_routing"] = {"capacity_order": order}
    return doc


def placer(doc: dict) -> Placer:
    f = region_view(parse_fleet(doc), "us")
    return Placer(detect_nodes(f.nodes), CapacityBook.of(f))


ONE_GPU = Need(1, float("inf"))


def test_reserved_first_then_on_demand_then_spot_within_each_kinds_units():
    p = placer(fleet())
    nodes = [p.place(f"r{i}", "m", ONE_GPU).node for i in range(5)]
    # reserved (1 unit), on-demand (2 units though od-2 has room for more), then spot
    assert nodes[0] == "res" and sorted(nodes[1:3]) == ["od-1", "od-2"] and set(nodes[3:]) == {"spot-1", "spot-2"}
    with pytest.raises(Unplaceable):
        p.place("r5", "m", ONE_GPU)
    p.release("r0")
    assert p.place("r6", "m", ONE_GPU).node == "res"  # freed reserved capacity is used first again


def test_the_order_is_configurable_and_a_kind_left_out_is_never_used():
    p = placer(fleet(order=["spot", "reserved"]))
    nodes = [p.place(f"r{i}", "m", ONE_GPU).node for i in range(3)]
    assert set(nodes[:2]) == {"spot-1", "spot-2"} and nodes[2] == "res"
    with pytest.raises(Unplaceable) as e:  # on-demand is left out: its free GPUs are not offered
        p.place("r3", "m", ONE_GPU)
    assert "spot-1" in str(e.value) and "od-" not in str(e.value)
    q = placer(fleet(order=["reserved"]))
    q.place("a", "m", ONE_GPU)
    with pytest.raises(Unplaceable, match="every capacity kind of region us is in use or left out of capacity_order"):
        q.place("b", "m", ONE_GPU)


class FakeMC:
    """A model controller as preemption sees it: its replicas, drain and poke."""

    def __init__(self, placer: Placer, replicas):
        from argosy.config import AutoscalingConfig

        self.name, self.a, self.replicas, self.placer = "m", AutoscalingConfig(drain_timeout_s=60), replicas, placer
        self.drained, self.poked = [], 0

    async def drain(self, r, timeout=None):
        self.drained.append((r.id, timeout))

    def poke(self):
        self.poked += 1


class Rep:
    def __init__(self, rid, node, state="ready"):
        self.id, self.node, self.state = rid, node, state


def test_preempted_spot_replica_drains_and_is_replaced_spot_elsewhere_then_on_demand():
    async def scenario():
        p = placer(fleet(order=["reserved", "spot", "on_demand"], spot={"gpu": "H100", "count": 2,
                                                                        "usd_per_hour": 1.2}))
        placed = {f"r{i}": p.place(f"r{i}", "m", ONE_GPU).node for i in range(3)}
        assert sorted(placed.values()) == ["res", "spot-1", "spot-2"]
        controller = type("C", (), {})()
        controller.placer = p
        mc = FakeMC(p, {rid: Rep(rid, node) for rid, node in placed.items()})
        controller.models = {"m": mc}
        pre = Preemptions(controller)
        victim = next(r for r, n in placed.items() if n == "spot-1")
        out = pre.apply(PreemptionNotice("spot-1", 30.0, "test"))
        await asyncio.sleep(0)
        assert out["draining"] == [{"model": "m", "replica": victim}] and mc.drained == [(victim, 30.0)]
        assert mc.poked == 1
        p.release(victim)  # drained and stopped
        # The replacement: spot-1 is cordoned and spot-2 holds the other spot unit's replica, so on-demand.
        assert p.place("r9", "m", ONE_GPU).node in ("od-1", "od-2")
        pre.apply(PreemptionNotice("spot-1", 0, "test", restore=True))
        assert "spot-1" not in p.cordoned
        with pytest.raises(KeyError, match="no node 'nope'"):
            pre.apply(PreemptionNotice("nope", 10))
        # A provider that hears of preemptions itself: its notices are applied as they come.

        async def notices():
            yield PreemptionNotice("spot-2", 120.0, "provider")
        pre.start({"cloud": type("P", (), {"preemption_notices": staticmethod(notices)})()})
        await asyncio.sleep(0.05)
        assert pre.notices["spot-2"]["source"] == "provider" and "spot-2" in p.cordoned
        await pre.stop()

    asyncio.run(scenario())


def test_status_shows_replicas_by_region_provider_and_kind_with_cost():
    book = CapacityBook.of(region_view(parse_fleet(fleet()), "us"))
    reps = [{"id": "r1", "state": "ready", "node": "res", "gpus": [0]},
            {"id": "r2", "state": "ready", "node": "spot-1", "gpus": [0]},
            {"id": "r3", "state": "draining", "node": "od-2", "gpus": [0, 1]}]
    for r in reps:
        r.update(book.describe(r), pooled=False, in_flight=0, age_s=1.0, cold_start_s=2.0, url="http://x")
    assert [r["usd_per_hour"] for r in reps] == [1.85, 1.2, 5.98] and reps[2]["capacity_kind"] == "on_demand"
    cap = summary(reps)
    assert cap["usd_per_hour"] == 9.03 and len(cap["groups"]) == 3
    st = {"nodes": [{"name": "spot-1", "provider": "local", "gpus": [], "memory_gib": None, "used_gib": 0,
                     "capacity_kind": "spot", "preempted": True}],
          "models": [{"model": "m", "provider": "local", "replicas": reps, "desired": 3, "panic": False,
                      "in_flight": 0, "queued": 0, "held": 0, "unplaceable": None, "decisions": [],
                      "recent_failures": []}],
          "capacity": {**cap, "preemptions": [{"node": "spot-1", "deadline_s": 30, "source": "admin", "at": "12:00:00",
                                               "draining": [{"model": "m", "replica": "r2"}]}]}}
    text = render(st)
    for want in ("node spot-1 (local, spot)", "PREEMPTED", "us         lambda     spot", "total $9.03/h",
                 "preemption notice at 12:00:00 (admin): node spot-1, 30 s; draining r2"):
        assert want in text, text


def test_a_replica_across_nodes_uses_a_unit_of_its_kind_on_each_node():
    gpu = [{"model": "H100", "memory_gib": 80}]
    doc = fleet(reserved={"gpu": "H100", "count": 2, "usd_per_hour": 1.85})
    doc["regions"][0]["nodes"][:1] = [{"name": "res-a", "capacity": "reserved", "gpus": gpu * 2},
                                      {"name": "res-b", "capacity": "reserved", "gpus": gpu}]
    p = placer(doc)
    staged = p.place_stages("pp", "m", Need(2, float("inf")), stages=2)
    assert sorted(n for n, _ in staged.parts()) == ["res-a", "res-b"]
    # Both reserved units are in use (one per stage): res-a's free GPU is not offered as reserved.
    assert p.place("r1", "m", ONE_GPU).node in ("od-1", "od-2")
