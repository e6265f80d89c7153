"""The autoscaler as a pure class: observations in, decisions out, on a fake clock."""

from __future__ import annotations

from argosy.config import AutoscalingConfig
from argosy.fleet.autoscaler import Autoscaler, Observation


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
