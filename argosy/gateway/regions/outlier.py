"""Outlier detection and fail-back with hysteresis for one region as one model's target.

    unknown --ok--> in --(outlier_failures consecutive failures, or no fresh state for stale_after_s)--> out
    out --ok--> holding (healthy, no traffic yet) --hold_down_s--> ramping (share 0 -> 1 over ramp_s) --> in
    holding or ramping --a failure--> out again (the hold-down starts over)

A failure is a failed state exchange, a state that says the model has no live replica there, or a
forwarded request that failed before its first byte. A region seen healthy for the first time is in at
once, whatever failed before: hysteresis is for coming back, not for joining.
"""

from __future__ import annotations

import time

UNKNOWN, IN, OUT, HOLDING, RAMPING = "unknown", "in", "out", "holding", "ramping"


class RegionHealth:
    __slots__ = ("failures_to_eject", "stale_after", "hold_down", "ramp", "clock", "state", "consecutive",
                 "last_ok", "out_since", "healthy_since", "ejections")

    def __init__(self, failures_to_eject: int, stale_after_s: float, hold_down_s: float, ramp_s: float,
                 clock=time.monotonic):
        self.failures_to_eject, self.stale_after = failures_to_eject, stale_after_s
        self.hold_down, self.ramp, self.clock = hold_down_s, ramp_s, clock
        self.state = UNKNOWN
        self.consecutive = 0
        self.last_ok: float | None = None
        self.out_since: float | None = None
        self.healthy_since: float | None = None  # since when it has been healthy again after being out
        self.ejections = 0

    def ok(self) -> None:
        now = self.clock()
        self.consecutive, self.last_ok = 0, now
        if self.state == UNKNOWN:
            self.state = IN
        elif self.state == OUT:
            self.state, self.healthy_since = HOLDING, now

    def fail(self, at_once: bool = False) -> None:
        """One failure; `at_once`: a definite one (the region says it cannot serve) ejects without waiting
        for `outlier_failures` of them."""
        self.consecutive += 1
        if at_once or self.consecutive >= self.failures_to_eject:
            self.eject()

    def eject(self) -> None:
        if self.state == UNKNOWN:
            return  # never was in: nothing to take out (it joins, without a hold-down, once healthy)
        if self.state != OUT:
            self.state, self.out_since, self.healthy_since = OUT, self.clock(), None
            self.ejections += 1

    def share(self) -> float:
        """The share of the traffic it may take now: 0 out, holding or never heard from; 1 in; between while
        it ramps back."""
        now = self.clock()
        if self.state in (IN, HOLDING, RAMPING) and self.last_ok is not None and now - self.last_ok > self.stale_after:
            self.eject()  # nothing fresh from it: out
        if self.state == IN:
            return 1.0
        if self.state in (HOLDING, RAMPING):
            t = now - self.healthy_since - self.hold_down
            if t < 0:
                return 0.0
            if t >= self.ramp:
                self.state = IN
                return 1.0
            self.state = RAMPING
            return max(t / self.ramp, 1e-3)
        return 0.0

    def snapshot(self) -> dict:
        share = self.share()
        return {"state": self.state, "share": round(share, 3), "consecutive_failures": self.consecutive,
                "ejections": self.ejections}
