"""What a rollout's analysis compares: each revision's finished requests over a window of time.

While a model has a rollout in progress the gateway records one RequestSample per finished request
(and per shadow request) in its RevisionStats: when it ended, the revision, whether it failed, TTFT,
end-to-end time, the gaps between streamed chunks and the output tokens. Nothing of the text is kept.
The controller's analysis asks for a window (`window(t0, t1)`) and gets one WindowStats per revision and
source (live traffic, or shadow copies), the raw values from which it takes exact percentiles.
Bounded: samples older than `horizon_s`, or beyond `max_samples`, are dropped (oldest first).
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from dataclasses import dataclass, field

LIVE, SHADOW = "live", "shadow"


@dataclass(slots=True)
class RequestSample:
    t: float  # when it finished (monotonic)
    revision: str
    source: str  # LIVE or SHADOW
    failed: bool  # a 5xx, no upstream, or a stream cut off (4xx: the caller's error, not recorded)
    e2e: float
    ttft: float | None = None  # streamed requests only
    gaps: list[float] | None = None  # seconds between streamed chunks
    tokens: int = 0  # output tokens (usage; about one per streamed event)


@dataclass
class WindowStats:
    """One revision's requests (of one source) that finished inside a window."""
    requests: int = 0
    failed: int = 0
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0

    def add(self, s: RequestSample) -> None:
        self.requests += 1
        if s.failed:
            self.failed += 1
            return  # a failed request's latency says nothing about the revision's speed
        self.e2e.append(s.e2e)
        if s.ttft is not None:
            self.ttft.append(s.ttft)
        if s.gaps:
            self.gaps.extend(s.gaps)
        self.tokens += s.tokens

    def merge(self, other: WindowStats) -> WindowStats:
        out = WindowStats(self.requests + other.requests, self.failed + other.failed, self.ttft + other.ttft,
                          self.e2e + other.e2e, self.gaps + other.gaps, self.tokens + other.tokens)
        return out


def output_tokens(stream: bool, events: int, output: list[bytes]) -> int:
    """A finished call's output tokens: about one per streamed event (less [DONE]), else its usage."""
    if stream:
        return max(0, events - 1)
    try:
        return int(json.loads(b"".join(output))["usage"]["completion_tokens"])
    except (ValueError, KeyError, TypeError):
        return 0


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    v = sorted(values)
    return v[max(0, math.ceil(q / 100 * len(v)) - 1)]


class RevisionStats:
    def __init__(self, horizon_s: float = 900.0, max_samples: int = 100_000, clock=time.monotonic):
        self.horizon_s, self.clock = horizon_s, clock
        self.samples: deque[RequestSample] = deque(maxlen=max_samples)

    def add(self, s: RequestSample) -> None:
        self.samples.append(s)
        old = s.t - self.horizon_s
        while self.samples and self.samples[0].t < old:
            self.samples.popleft()

    def window(self, t0: float, t1: float) -> dict[tuple[str, str], WindowStats]:
        """(revision, source) -> the requests that finished in [t0, t1)."""
        out: dict[tuple[str, str], WindowStats] = {}
        for s in list(self.samples):
            if t0 <= s.t < t1:
                out.setdefault((s.revision, s.source), WindowStats()).add(s)
        return out

    def clear(self) -> None:
        self.samples.clear()
