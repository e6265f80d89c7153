"""The traffic file: arrivals, lengths, shared prefixes, regions and failures, and the requests it makes.

The arrival rate is `rate` (req/s at the peak) times the diurnal curve, the weekly factor of the day
and any spike; arrivals are a unit-rate renewal process (gamma gaps of shape `burstiness`: 1 is
Poisson) mapped through the integrated rate, as `argosy bench --ramp` does, so any rate curve is exact.
A `trace` (the JSONL format of `argosy bench --trace`) replaces the synthetic arrivals and lengths.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import Field, ValidationError, model_validator

from argosy.bench.workload import DISTRIBUTIONS, LengthDist, load_trace
from argosy.config_section import ConfigSection
from argosy.config_yaml import YamlFileError, read_yaml

DAY_S, WEEK_S = 86400.0, 604800.0
# The most requests one simulated run makes: each holds a few hundred bytes until it finishes, and a
# typo'd rate or duration should get a line, not numpy's "Maximum allowed dimension exceeded" or a
# machine out of memory.
MAX_REQUESTS = 10_000_000


class Lengths(ConfigSection):
    mean: int = Field(ge=1)
    dist: str = "fixed"
    spread: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _known(self) -> Lengths:
        if self.dist not in DISTRIBUTIONS:
            raise ValueError(f"dist must be one of {', '.join(DISTRIBUTIONS)}")
        return self

    def dist_obj(self) -> LengthDist:
        return LengthDist(self.mean, self.dist, self.spread)


class Diurnal(ConfigSection):
    trough: float = Field(0.3, ge=0, le=1)  # the rate at the quietest hour, as a share of the peak
    peak_hour: float = Field(14.0, ge=0, lt=24)


class Spike(ConfigSection):
    at_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)
    multiplier: float = Field(gt=0)


class SharedPrefix(ConfigSection):
    tokens: int = Field(ge=1)  # length of each shared prefix (a system prompt)
    groups: int = Field(1, ge=1)  # how many different prefixes (tenants, apps)
    fraction: float = Field(1.0, ge=0, le=1)  # share of requests that start with one


class Region(ConfigSection):
    name: str
    share: float = Field(1.0, gt=0)  # share of the traffic from this region (normalized)


class Failure(ConfigSection):
    region: str
    at_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)
    replica: int | None = Field(None, ge=0)  # None: the whole region; else that replica (index in the region)
    # A spot preemption with this much notice (s): the replica drains (its requests finish, none new) and a
    # replacement starts at once, instead of dying. With replica only.
    notice_s: float | None = Field(None, ge=0)


class TrafficSpec(ConfigSection):
    duration_s: float = Field(gt=0)
    rate: float = Field(1.0, gt=0)  # req/s at the peak of the curve
    burstiness: float = Field(1.0, gt=0)
    start_s: float = Field(0.0, ge=0)  # where in the week t=0 falls (0: Monday 00:00)
    diurnal: Diurnal | None = None
    weekly: list[float] | None = None  # seven factors, Monday first
    spikes: list[Spike] = []
    prompt_tokens: Lengths = Lengths(mean=512)
    output_tokens: Lengths = Lengths(mean=128)
    shared_prefix: SharedPrefix | None = None
    trace: str | None = None
    regions: list[Region] = [Region(name="default")]
    failover_rtt_s: float = Field(0.08, ge=0)  # added to each request served from another region
    # Round trips between regions (either order), for a fleet file with regions: what its gateways would
    # measure; a pair left out takes failover_rtt_s.
    rtt_s: dict[str, dict[str, float]] = {}
    failures: list[Failure] = []
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> TrafficSpec:
        if self.weekly is not None and (len(self.weekly) != 7 or min(self.weekly) < 0):
            raise ValueError("weekly needs seven factors >= 0, Monday first")
        names = [r.name for r in self.regions]
        if len(set(names)) != len(names) or not names:
            raise ValueError("regions need unique names (and at least one)")
        for f in self.failures:
            if f.region not in names:
                raise ValueError(f"failure in unknown region {f.region!r} (regions: {', '.join(names)})")
            if f.notice_s is not None and f.replica is None:
                raise ValueError("failures: notice_s (a preemption) needs a replica")
        for a, row in self.rtt_s.items():
            for b, v in row.items():
                if a not in names or b not in names or not v >= 0:
                    raise ValueError(f"rtt_s.{a}.{b}: regions must be the traffic's and round trips >= 0")
        return self

    def rtt(self, a: str, b: str) -> float:
        """The round trip between two regions (0 within one)."""
        if a == b:
            return 0.0
        got = self.rtt_s.get(a, {}).get(b)
        got = self.rtt_s.get(b, {}).get(a) if got is None else got
        return self.failover_rtt_s if got is None else got

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        """Arrival rate (req/s) at run times t."""
        r = np.full_like(t, self.rate, dtype=float)
        w = t + self.start_s
        if self.diurnal is not None:
            d = self.diurnal
            hour = (w % DAY_S) / 3600.0
            r *= d.trough + (1 - d.trough) * (1 + np.cos(2 * np.pi * (hour - d.peak_hour) / 24)) / 2
        if self.weekly is not None:
            r *= np.asarray(self.weekly)[((w % WEEK_S) // DAY_S).astype(int)]
        for s in self.spikes:
            r = np.where((t >= s.at_s) & (t < s.at_s + s.duration_s), r * s.multiplier, r)
        return r


class TrafficError(ValueError):
    """The traffic file is unreadable or invalid; the message names the file and the fields."""


def load_traffic(path: str | Path) -> TrafficSpec:
    p = Path(path)
    try:
        data = read_yaml(p)
    except YamlFileError as e:
        raise TrafficError(str(e)) from None
    try:
        spec = TrafficSpec.model_validate(data or {})
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or '(top level)'}: {err['msg']}" for err in e.errors())
        raise TrafficError(f"{p}: invalid traffic file: {errs}") from None
    if spec.trace is not None and not Path(spec.trace).is_absolute():
        spec = spec.model_copy(update={"trace": str(p.parent / spec.trace)})
    return spec


@dataclass
class Requests:
    """Column lists (plain Python lists: the event loop reads them one by one)."""

    arrival_s: list[float]
    region: list[int]
    prompt_tokens: list[int]
    output_tokens: list[int]
    prefix_group: list[int]  # -1: no shared prefix

    def __len__(self) -> int:
        return len(self.arrival_s)


def arrival_times(spec: TrafficSpec, rng: np.random.Generator) -> np.ndarray:
    grid = np.linspace(0.0, spec.duration_s, int(min(max(spec.duration_s, 2), 200_000)) + 1)
    rates = spec.rate_at(grid)
    cum = np.concatenate([[0.0], np.cumsum((rates[1:] + rates[:-1]) / 2 * np.diff(grid))])  # Lambda(t)
    total, k = cum[-1], spec.burstiness
    if not total <= MAX_REQUESTS:
        many = f"{total:,.0f}" if total < 1e12 else f"{total:.1e}"
        raise TrafficError(f"the traffic makes about {many} requests; one simulated run takes at most "
                           f"{MAX_REQUESTS:,} (lower rate or duration_s)")
    n = int(total + 6 * math.sqrt(total / k) + 16)
    s = np.cumsum(rng.gamma(k, 1.0 / k, size=n))
    s = s[s < total]
    return np.interp(s, cum, grid)


def make_requests(spec: TrafficSpec) -> Requests:
    rng = np.random.default_rng(spec.seed)
    lrng = random.Random(spec.seed)
    if spec.trace is not None:
        try:
            jobs = load_trace(spec.trace, spec.output_tokens.mean, spec.seed)
        except OSError as e:
            raise TrafficError(f"trace {spec.trace}: {e.strerror or e}") from None
        except ValueError as e:
            raise TrafficError(str(e)) from None
        jobs = [j for j in jobs if (j.at_s or 0.0) <= spec.duration_s]
        times = [j.at_s or 0.0 for j in jobs]
        prompts = [j.turns[0].new_tokens for j in jobs]
        outputs = [j.turns[0].output_tokens for j in jobs]
    else:
        times = arrival_times(spec, rng).tolist()
        pd, od = spec.prompt_tokens.dist_obj(), spec.output_tokens.dist_obj()
        prompts = [pd.sample(lrng) for _ in times]
        outputs = [od.sample(lrng) for _ in times]
    n = len(times)
    shares = np.array([r.share for r in spec.regions], dtype=float)
    regions = rng.choice(len(shares), size=n, p=shares / shares.sum()).tolist()
    sp = spec.shared_prefix
    if sp is None:
        groups = [-1] * n
    else:
        has = rng.random(n) < sp.fraction
        groups = np.where(has, rng.integers(0, sp.groups, size=n), -1).tolist()
    return Requests(times, regions, prompts, outputs, groups)
