"""The autoscaler's metric registry and decision kinds: one table read by the config, the autoscaler,
the model controller (whether to scrape) and the metrics it exports."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from argosy.config import AutoscalingConfig, FleetConfigError, parse_fleet
from argosy.fleet.autoscaler import IDLE, PANIC, STABLE, Autoscaler, Observation
from argosy.fleet.metrics import FleetMetrics
from argosy.fleet.model_controller import ModelController
from argosy.fleet.placement import Need, Placer
from argosy.fleet.scaling_metrics import METRICS
from argosy.gateway.prefix_index import PrefixIndex
from argosy.gateway.traffic import ModelRuntime, UpstreamRegistry


class Clock:
    t = 1000.0

    def __call__(self) -> float:
        return self.t


def feed(a: Autoscaler, clock: Clock, o: Observation, seconds: int, ready: int):
    d = None
    for _ in range(seconds):
        clock.t += 1
        a.observe(o, ready)
        d = a.decide(ready)
    return d


def cfg(**kw) -> AutoscalingConfig:
    base = dict(min_replicas=1, max_replicas=10, target=10, target_utilization=1.0, stable_window_s=60,
                panic_window_s=6, scale_down_delay_s=0)
    return AutoscalingConfig(**{**base, **kw})


def test_decisions_carry_their_kind_and_the_bound_that_moved_them():
    c = Clock()
    a = Autoscaler(cfg(max_replicas=4), c)
    d = feed(a, c, Observation(concurrency=0), 5, ready=0)
    assert (d.kind, d.limited_by, d.desired) == (STABLE, "min_replicas", 1)
    d = feed(a, c, Observation(concurrency=100), 3, ready=1)
    assert (d.kind, d.limited_by, d.desired) == (PANIC, "max_replicas", 4)
    c2 = Clock()
    b = Autoscaler(cfg(scale_down_delay_s=30, stable_window_s=5, panic_window_s=1), c2)
    feed(b, c2, Observation(concurrency=40), 10, ready=4)
    d = feed(b, c2, Observation(concurrency=10), 10, ready=4)
    assert (d.kind, d.limited_by, d.desired) == (STABLE, "scale_down_delay", 4)
    assert "held at 4 by scale_down_delay" in d.reason  # the reason is still written for people
    c3 = Clock()
    z = Autoscaler(cfg(scale_to_zero_after_s=5, stable_window_s=5, panic_window_s=1), c3)
    d = feed(z, c3, Observation(concurrency=0), 6, ready=1)
    assert (d.kind, d.limited_by, d.desired, d.direction) == (IDLE, None, 0, "down")


def test_each_metric_reads_its_sample_from_the_registry():
    o = Observation(concurrency=3, rps=5, queue=7, kv_cache=0.25, tokens=900)
    assert {name: m.value_fn(o, 4) for name, m in METRICS.items()} == {
        "concurrency": 3, "rps": 5, "queue": 7, "kv_cache": 1.0,  # KV in use, in replicas' worth
        "tokens": 900}  # the encoders' default (issue 19)
    with pytest.raises(FleetConfigError, match="autoscaling.metric"):
        parse_fleet({"models": [{"name": "m", "autoscaling": {"metric": "latency"}}]})
    with pytest.raises(FleetConfigError, match="fraction of a replica's KV cache"):
        parse_fleet({"models": [{"name": "m", "autoscaling": {"metric": "kv_cache", "target": 2}}]})


@pytest.mark.parametrize("metric", sorted(METRICS))
def test_the_controller_scrapes_replicas_only_for_metrics_that_need_it(metric):
    fleet = parse_fleet({"models": [{"name": "m", "checkpoint": "/nonexistent", "autoscaling": {
        "metric": metric, "target": 0.5, "min_replicas": 0, "scale_to_zero_after_s": 1}}]}, "test")
    rt = ModelRuntime(fleet.models[0], UpstreamRegistry(fleet.gateway), PrefixIndex(), None, lambda: None)
    scrapes = []

    async def refresh(urls):
        scrapes.append(list(urls))
        return {}

    gateway = SimpleNamespace(scraper=SimpleNamespace(refresh=refresh))
    registry, clock = CollectorRegistry(), Clock()
    mc = ModelController(fleet.models[0], rt, gateway, None, Placer([]), Need.of(0, 0.0, {}),
                         FleetMetrics(registry), clock)
    clock.t += 2  # idle past scale_to_zero_after_s: the decision is to stay at zero
    asyncio.run(mc.tick())
    assert bool(scrapes) == (metric in ("queue", "kv_cache"))
    labels = {"model": "m", "direction": "hold", "reason": "idle"}
    assert registry.get_sample_value("argosy_fleet_scaling_decisions_total", labels) == 1
