"""When to send: open-loop arrival times (seconds from the run's start).

Gaps are gamma-distributed with shape `burstiness` (1: Poisson, exponential gaps; < 1 burstier; > 1
more even; inf: a fixed gap), as in vLLM's `--burstiness`. A ramp is a rate growing linearly from
FROM to TO: we draw a unit-rate renewal process and map it through the inverse of the integrated rate
Lambda(t) = a*t + (b - a)*t^2/(2T), which gives a non-homogeneous process with exactly that rate
curve (no thinning, no per-step re-draws).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np


class Ramp:
    """Rate a -> b req/s, linearly over `span_s` seconds."""

    def __init__(self, start: float, end: float, span_s: float):
        if start < 0 or end < 0 or start + end <= 0 or span_s <= 0:
            raise ValueError("a ramp needs rates >= 0 (not both 0) and a positive span")
        self.a, self.b, self.span_s = start, end, span_s

    def rate_at(self, t: float) -> float:
        return self.a + (self.b - self.a) * min(t, self.span_s) / self.span_s

    def total(self) -> float:
        """Expected arrivals over the span: Lambda(T)."""
        return (self.a + self.b) * self.span_s / 2

    def time_of(self, s: float) -> float:
        """Lambda^-1(s): the time by which `s` arrivals are expected."""
        a, k = self.a, (self.b - self.a) / self.span_s
        if abs(k) < 1e-12:
            return s / a
        return (-a + math.sqrt(max(a * a + 2 * k * s, 0.0))) / k


def arrival_times(rate: float, *, burstiness: float = 1.0, seed: int = 0, duration_s: float | None = None,
                  num: int | None = None, ramp: tuple[float, float] | None = None) -> Iterator[float]:
    """Arrival times until `num` arrivals or `duration_s` seconds, whichever comes first.

    `rate` in req/s (inf: everything at t=0). With `ramp`, `rate` is ignored and the ramp spans the
    duration, or, without one, the time in which `num` arrivals are expected.
    """
    if burstiness <= 0:
        raise ValueError("burstiness must be > 0")
    if duration_s is None and num is None:
        raise ValueError("need a duration or a number of requests")
    curve = None
    if ramp is not None:
        span = duration_s if duration_s is not None else 2 * num / (ramp[0] + ramp[1])
        curve = Ramp(ramp[0], ramp[1], span)
    elif rate <= 0:
        raise ValueError("rate must be > 0")
    elif math.isinf(rate) and num is None:
        raise ValueError("an infinite rate needs a number of requests")
    rng = np.random.default_rng(seed)
    s = 0.0  # operational time: a unit-rate renewal process
    count = 0
    while num is None or count < num:
        if curve is None and math.isinf(rate):
            t = 0.0
        else:
            s += 1.0 if math.isinf(burstiness) else float(rng.gamma(burstiness, 1.0 / burstiness))
            if curve is not None:
                if s > curve.total():
                    return
                t = curve.time_of(s)
            else:
                t = s / rate
        if duration_s is not None and t > duration_s:
            return
        yield t
        count += 1
