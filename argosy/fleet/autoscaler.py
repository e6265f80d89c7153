"""A per-model autoscaler in the manner of Knative's pod autoscaler (KPA), as a pure class.

Observations go in (`observe`), a decision comes out (`decide`); time comes from an injectable clock,
so it is unit-tested without processes and the simulator runs the same code.

    desired = ceil(observed / (target * target_utilization))
observed is averaged over the stable window (default 60 s) and over the panic window (6 s). When the
panic-window value needs `panic_threshold` (2x) the ready capacity, the model panics: it scales on the
panic value at once and never scales down until the load has stayed under the threshold for a whole
stable window. Each decision is bounded by the scale-up/down rates, held at the highest desired count
of the last `scale_down_delay_s` (so a dip does not shed replicas), then by min/max replicas. After
`scale_to_zero_after_s` with no load at all, the model goes to zero.

The metric (fleet/scaling_metrics.py) turns an observation into a sample. A decision carries its `kind`
(the rule that decided: stable, panic or idle) and `limited_by` (the bound that then moved the count,
if any), for metrics and logs; `reason` is the same said for people.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

from argosy.config import AutoscalingConfig
from argosy.fleet.scaling_metrics import METRICS, Observation

__all__ = ["Autoscaler", "Decision", "Observation", "STABLE", "PANIC", "IDLE"]

# Decision kinds: the bounded `reason` label of argosy_fleet_scaling_decisions_total.
STABLE = "stable"  # the stable-window average decided
PANIC = "panic"  # the panic-window average decided (no scale-down while panicking)
IDLE = "idle"  # no load for scale_to_zero_after_s: zero replicas


@dataclass(frozen=True)
class Decision:
    t: float
    desired: int
    actual: int  # replicas wanted before this decision (ready + starting)
    ready: int
    direction: str  # up | down | hold
    panic: bool
    stable_value: float  # the metric averaged over each window
    panic_value: float
    metric: str
    reason: str  # for people, e.g. "stable: 3.00 over 60 s / 11.2 per replica"
    kind: str = STABLE  # STABLE, PANIC or IDLE
    # The bound that moved the count after the window's value: scale_up_rate, scale_down_rate,
    # scale_down_delay, min_replicas or max_replicas (the last that did), or None.
    limited_by: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


class Autoscaler:
    def __init__(self, cfg: AutoscalingConfig, clock: Callable[[], float] = time.monotonic):
        self.cfg, self.clock = cfg, clock
        self.metric = METRICS[cfg.metric]
        self.samples: deque[tuple[float, float]] = deque()  # (t, metric value in replica-sized units)
        self.recent: deque[tuple[float, int]] = deque()  # (t, desired) for the scale-down delay
        self.panic_since: float | None = None  # last time the panic threshold was exceeded, while panicking
        self.max_panic = 0
        self.last_active = clock()  # last observation with any load (scale to zero counts from here)
        self.last: Decision | None = None

    def observe(self, o: Observation, ready: int = 1) -> None:
        now = self.clock()
        self.samples.append((now, self.metric.value_fn(o, ready)))
        if o.concurrency > 0 or o.queue > 0 or o.rps > 0:
            self.last_active = now
        horizon = now - max(self.cfg.stable_window_s, self.cfg.panic_window_s)
        while self.samples and self.samples[0][0] < horizon:
            self.samples.popleft()

    def _avg(self, now: float, window: float) -> float:
        vals = [v for t, v in self.samples if t > now - window]
        return sum(vals) / len(vals) if vals else 0.0

    def decide(self, ready: int, actual: int | None = None) -> Decision:
        c, now = self.cfg, self.clock()
        actual = ready if actual is None else actual
        per = c.target * c.target_utilization
        stable, panic_v = self._avg(now, c.stable_window_s), self._avg(now, c.panic_window_s)
        want_stable, want_panic = math.ceil(stable / per - 1e-9), math.ceil(panic_v / per - 1e-9)
        base = max(ready, 1)  # Knative counts at least one pod, so a cold start can panic too
        over = panic_v / per / base >= c.panic_threshold
        if over:
            self.panic_since = now  # enter, or extend, panic
        elif self.panic_since is not None and now - self.panic_since >= c.stable_window_s:
            self.panic_since, self.max_panic = None, 0
        panicking = self.panic_since is not None
        limited_by = None
        if panicking:
            kind, desired = PANIC, max(want_panic, self.max_panic)  # never scale down while panicking
            self.max_panic = desired
            reason = f"panic: {panic_v:.2f} over {c.panic_window_s:g} s is >= {c.panic_threshold:g}x capacity"
        else:
            kind, desired = STABLE, want_stable
            reason = f"stable: {stable:.2f} over {c.stable_window_s:g} s / {per:g} per replica"
        max_up = math.ceil(c.max_scale_up_rate * base)
        max_down = math.floor(base / c.max_scale_down_rate)
        if desired > max_up:
            desired, limited_by = max_up, "scale_up_rate"
        elif desired < max_down:
            desired, limited_by = max_down, "scale_down_rate"
        self.recent.append((now, desired))
        while self.recent and self.recent[0][0] < now - c.scale_down_delay_s:
            self.recent.popleft()
        delayed = max(d for _, d in self.recent)
        if delayed > desired:
            reason += f"; held at {delayed} by scale_down_delay {c.scale_down_delay_s:g} s"
            desired, limited_by = delayed, "scale_down_delay"
        if ready == 0 and actual > 0:
            # A replica is starting and none is ready: the idle countdown waits for it (Knative reaches its
            # initial scale before it may scale to zero). Else a cold start longer than scale_to_zero_after_s
            # is cancelled before it can serve, and the next request starts another.
            self.last_active = now
        idle = now - self.last_active
        if c.scale_to_zero_after_s is not None and idle >= c.scale_to_zero_after_s and not panicking:
            desired, reason = 0, f"idle {idle:.1f} s >= scale_to_zero_after {c.scale_to_zero_after_s:g} s"
            kind, limited_by = IDLE, None
        else:
            floor = c.min_replicas
            if c.scale_to_zero_after_s is not None:
                floor = max(floor, 1)  # zero only after the idle time, never earlier
            if desired < floor:
                desired, limited_by = floor, "min_replicas"
            elif desired > c.max_replicas:
                desired, limited_by = c.max_replicas, "max_replicas"
        direction = "up" if desired > actual else "down" if desired < actual else "hold"
        self.last = Decision(now, desired, actual, ready, direction, panicking, round(stable, 4),
                             round(panic_v, 4), c.metric, reason, kind, limited_by)
        return self.last
