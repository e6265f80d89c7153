"""The autoscaler as a pure class: observations in, decisions out, on a fake clock; and what the model
controller observes for it, on fakes."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from argosy.config import AdmissionConfig, AutoscalingConfig, parse_fleet
from argosy.fleet.autoscaler import Autoscaler, Observation
from argosy.fleet.metrics import FleetMetrics
from argosy.fleet.model_controller import ModelController
from argosy.fleet.placement import Need, Placer
from argosy.fleet.replica import DRAINING, READY, Replica, ReplicaSpec
from argosy.gateway.admission import Admission
from argosy.gateway.prefix_index import PrefixIndex
from argosy.gateway.traffic import ModelRuntime, UpstreamRegistry


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def run(a: Autoscaler, clock: Clock, concurrency: float, seconds: float, ready: int, step: float = 1.0):
    """Feed `concurrency` every `step` s for `seconds`; return the last decision."""
    d = None
    for _ in range(int(seconds / step)):
        clock.t += step
        a.observe(Observation(concurrency=concurrency), ready)
        d = a.decide(ready)
    return d


def cfg(**kw) -> AutoscalingConfig:
    base = dict(min_replicas=1, max_replicas=10, target=10, target_utilization=1.0, stable_window_s=60,
                panic_window_s=6, panic_threshold=2.0, scale_down_delay_s=0)
    return AutoscalingConfig(**{**base, **kw})


def test_steady_load_gives_ceil_of_concurrency_over_target():
    c = Clock()
    a = Autoscaler(cfg(target=10, target_utilization=0.7), c)
    d = run(a, c, 30, 60, ready=5)  # 30 / 7 = 4.3 -> 5
    assert d.desired == 5 and not d.panic and d.direction == "hold"


def test_a_spike_panics_and_scales_up_within_the_panic_window():
    c = Clock()
    a = Autoscaler(cfg(), c)
    run(a, c, 10, 60, ready=1)  # one replica at target
    d = run(a, c, 100, 3, ready=1)  # 10x: the 60 s average barely moved, the 6 s one did
    assert d.panic and d.desired == 6 and d.direction == "up"  # (3 x 10 + 3 x 100) / 6 / 10
    assert d.stable_value < d.panic_value
    d = run(a, c, 100, 3, ready=6)
    assert d.panic and d.desired == 10


def test_no_scale_down_while_panicking_then_stable_after_a_quiet_window():
    c = Clock()
    a = Autoscaler(cfg(), c)
    run(a, c, 100, 4, ready=1)
    assert a.last.panic and a.last.desired == 10
    d = run(a, c, 30, 30, ready=10)  # load fell, but we are still in the panic window's stable hold
    assert d.panic and d.desired == 10
    d = run(a, c, 30, 61, ready=10)  # a whole stable window under the threshold: panic ends
    assert not d.panic and d.desired == 5  # rate-limited: 10 ready / max_scale_down_rate 2
    d = run(a, c, 30, 5, ready=5)
    assert d.desired == 3


def test_scale_rates_bound_each_decision():
    c = Clock()
    a = Autoscaler(cfg(max_scale_up_rate=2.0, max_replicas=100), c)
    d = run(a, c, 500, 3, ready=2)
    assert d.desired == 4  # 2 ready x rate 2


def test_scale_down_delay_holds_the_highest_recent_decision():
    c = Clock()
    a = Autoscaler(cfg(scale_down_delay_s=30, stable_window_s=5, panic_window_s=1), c)
    run(a, c, 40, 10, ready=4)
    d = run(a, c, 10, 10, ready=4)
    assert d.desired == 4 and "scale_down_delay" in d.reason
    d = run(a, c, 10, 25, ready=4)
    assert d.desired == 2  # delay over; still bounded by the rate (4 / 2)


def test_min_and_max_replicas_clamp():
    c = Clock()
    a = Autoscaler(cfg(min_replicas=2, max_replicas=3), c)
    assert run(a, c, 0, 10, ready=2).desired == 2
    assert run(a, c, 1000, 70, ready=3).desired == 3


def test_scale_to_zero_only_after_the_idle_time_and_back_at_the_first_request():
    c = Clock()
    a = Autoscaler(cfg(min_replicas=1, scale_to_zero_after_s=20, stable_window_s=10, panic_window_s=2), c)
    run(a, c, 5, 10, ready=1)
    d = run(a, c, 0, 19, ready=1)
    assert d.desired == 1
    d = run(a, c, 0, 2, ready=1)
    assert d.desired == 0 and "idle" in d.reason and d.direction == "down"
    d = run(a, c, 1, 1, ready=0)  # a request held by the activator counts as concurrency
    assert d.desired == 1 and d.direction == "up"


def test_a_starting_replica_is_not_scaled_to_zero_before_it_could_serve():
    # A first replica with a cold start longer than scale_to_zero_after_s: no load while it starts, yet
    # the idle countdown waits until it is ready, then runs its full length.
    c = Clock()
    a = Autoscaler(cfg(min_replicas=0, scale_to_zero_after_s=5, stable_window_s=10, panic_window_s=2), c)
    for _ in range(60):  # 60 s of cold start, nothing ready, one replica starting
        c.t += 1
        a.observe(Observation(concurrency=0), 0)
        d = a.decide(0, 1)
        assert d.desired == 1, d.reason
    d = run(a, c, 0, 4, ready=1)
    assert d.desired == 1
    d = run(a, c, 0, 2, ready=1)
    assert d.desired == 0 and d.kind == "idle"


def test_other_metrics():
    c = Clock()
    a = Autoscaler(cfg(metric="kv_cache", target=0.8, target_utilization=1.0), c)
    for _ in range(10):
        c.t += 1
        a.observe(Observation(concurrency=1, kv_cache=0.9), ready=4)
    assert a.decide(4).desired == 5  # 0.9 x 4 replicas / 0.8 = 4.5
    c2 = Clock()
    q = Autoscaler(cfg(metric="queue", target=4), c2)
    for _ in range(10):
        c2.t += 1
        q.observe(Observation(concurrency=0, queue=10), ready=2)
    assert q.decide(2).desired == 3
    c3 = Clock()
    r = Autoscaler(cfg(metric="rps", target=5), c3)
    for _ in range(10):
        c3.t += 1
        r.observe(Observation(concurrency=0, rps=12), ready=1)
    assert r.decide(1).desired == 3


def spike_cfg() -> AutoscalingConfig:
    """bench/autoscale_spike.py's settings: 4 per replica, at most 4 replicas, ticks every 0.5 s."""
    return cfg(max_replicas=4, target=4, stable_window_s=20, panic_window_s=3, scale_down_delay_s=5)


def test_a_sustained_spike_at_max_replicas_never_scales_down_when_panic_ends():
    # The bench's step seen as the gateway should see it: 40 streams in flight while replicas come up,
    # then for 40 s with all 4 ready. 40 / 4 = 10 wanted, capped at 4: no decision may go under 4 once
    # there, neither while panicking nor after the panic ends (30 in flight: under 2x 4 replicas' worth).
    for load in (40, 30):
        c = Clock()
        a = Autoscaler(spike_cfg(), c)
        run(a, c, 4, 10, ready=1, step=0.5)
        seen = []
        for ready in (1, 1, 2, 3):
            seen.append(run(a, c, load, 2, ready=ready, step=0.5))
        assert seen[0].panic and seen[0].desired == 4
        for _ in range(80):
            seen.append(run(a, c, load, 0.5, ready=4, step=0.5))
        assert all(d.desired == 4 for d in seen), [(d.desired, d.panic) for d in seen]
        assert seen[-1].panic == (load == 40)  # 40 >= 2 x 16 keeps it panicking; 30 ends the panic


def test_the_spike_bench_scale_down_followed_what_the_gateway_saw():
    # What the gateway really observed in the run that scaled to 2 under "40 clients": the load
    # generator, CPU-starved by the replicas, kept only ~5 requests in flight at the gateway once 4
    # replicas were up. Then the autoscaler is right to shed replicas a stable window after the last
    # over-threshold panic sample (5.5 / 4 -> 2, the rate bound allows 4 / 2).
    c = Clock()
    a = Autoscaler(spike_cfg(), c)
    run(a, c, 4, 10, ready=1, step=0.5)
    d = run(a, c, 15, 6, ready=1, step=0.5)
    assert d.panic and d.desired == 4
    d = run(a, c, 5.5, 19, ready=4, step=0.5)
    assert d.panic and d.desired == 4  # still within a stable window of the last panic sample
    d = run(a, c, 5.5, 10, ready=4, step=0.5)
    assert not d.panic and d.desired == 2


def test_observed_concurrency_is_every_stream_in_flight_or_queued_at_the_gateway():
    """The controller's observation counts what admission holds (streams in progress on any replica,
    draining ones included, requests held by the activator, and the queue), not the ready replicas'."""
    fleet = parse_fleet({"models": [{"name": "m", "checkpoint": "/nonexistent",
                                     "autoscaling": {"max_replicas": 4, "target": 4}}]}, "test")
    adm = Admission(AdmissionConfig(max_in_flight=40, max_queue=10))
    rt = ModelRuntime(fleet.models[0], UpstreamRegistry(fleet.gateway), PrefixIndex(), None, lambda: None)
    rt.admission = adm
    mc = ModelController(fleet.models[0], rt, None, None, Placer([]), Need.of(0, 0.0, {}),
                         FleetMetrics(CollectorRegistry()))
    for i, (state, streams) in enumerate(((READY, 18), (READY, 18), (DRAINING, 4))):
        r = Replica("m", ReplicaSpec("m", "/nonexistent", []))
        r.state, r.url = state, f"http://127.0.0.1:{9000 + i}"
        mc.replicas[r.id] = r
        rt.reg.get(r.url).in_flight = streams

    async def load() -> list[asyncio.Task]:
        for _ in range(40):
            await adm.acquire()  # 40 streams in flight, spread over two ready replicas and a draining one
        return [asyncio.create_task(adm.acquire()) for _ in range(3)]  # and 3 queued behind them

    async def scenario() -> None:
        queued = await load()
        await asyncio.sleep(0)
        o = mc.observe(mc.ready_routed())
        assert o.concurrency == 43 and o.queue == 3
        o = mc.observe([])  # what is ready does not change what is in flight
        assert o.concurrency == 43
        for t in queued:
            t.cancel()

    asyncio.run(scenario())
