"""The dashboard's time series: snapshots of the gateway's registry and the replicas' gauges, turned into
rates and latency quantiles between consecutive snapshots, kept for the last HISTORY points.

Sampling is lazy: a poll of /dashboard/data takes a snapshot when the last one is at least
MIN_INTERVAL_S old, so an unwatched gateway pays nothing and many open pages cost one snapshot a second.
The replicas' gauges come from whoever samples (the gateway's ReplicaScraper): this module fetches nothing.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

HISTORY = 300  # points kept: 10 min at the page's 2 s poll
MIN_INTERVAL_S = 1.0
# The replicas' gauges, by URL: {"kv": vllm:kv_cache_usage_perc, "waiting": ..., "running": ...}
ReplicaGaugesFn = Callable[[list[str]], Awaitable[dict[str, dict[str, float]]]]


@dataclass
class Snapshot:
    t: float  # wall clock, Unix seconds (the page's x axis)
    requests: dict[str, float] = field(default_factory=dict)  # model -> cumulative requests
    ttft: dict[str, dict[float, float]] = field(default_factory=dict)  # model -> {le: cumulative count}
    itl: dict[str, dict[float, float]] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)  # "refused: reason" | "status 503" -> cumulative
    queue: dict[str, float] = field(default_factory=dict)  # model -> gateway queue + replicas' waiting
    desired: dict[str, float] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)
    replicas: dict[str, dict[str, float]] = field(default_factory=dict)  # url -> {kv, waiting, running, busy, ...}


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative bucket counts {upper bound: count}."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            if math.isinf(b):
                return lower
            return lower + (b - lower) * ((rank - below) / (c - below) if c > below else 1.0)
        lower, below = b, c
    return lower


def read_registry(registry: Any, snap: Snapshot) -> None:
    for fam in registry.collect():
        for s in fam.samples:
            model = s.labels.get("model", "")
            if s.name == "argosy_gateway_requests_total":
                snap.requests[model] = snap.requests.get(model, 0.0) + s.value
                if int(s.labels.get("status", "0")) >= 400:
                    key = f"status {s.labels['status']}"
                    snap.errors[key] = snap.errors.get(key, 0.0) + s.value
            elif s.name == "argosy_gateway_rejections_total":
                key = f"refused: {s.labels['reason']}"
                snap.errors[key] = snap.errors.get(key, 0.0) + s.value
            elif s.name in ("argosy_gateway_ttft_seconds_bucket", "argosy_gateway_inter_token_seconds_bucket"):
                hist = snap.ttft if "ttft" in s.name else snap.itl
                per = hist.setdefault(model, {})
                le = float(s.labels["le"])
                per[le] = per.get(le, 0.0) + s.value  # summed over route and upstream
            elif s.name == "argosy_gateway_queue_depth":
                snap.queue[model] = snap.queue.get(model, 0.0) + s.value
            elif s.name == "argosy_fleet_desired_replicas":
                snap.desired[model] = s.value
            elif s.name == "argosy_fleet_actual_replicas":
                snap.ready[model] = s.value


def delta(cur: dict[float, float], prev: dict[float, float] | None) -> dict[float, float]:
    return {le: max(0.0, c - (prev or {}).get(le, 0.0)) for le, c in cur.items()}


class Sampler:
    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.last: Snapshot | None = None
        self.points: deque[dict[str, dict[str, float | None]]] = deque(maxlen=HISTORY)
        self.times: deque[float] = deque(maxlen=HISTORY)
        self.lock = asyncio.Lock()

    async def sample(self, urls_by_model: dict[str, list[str]], replica_gauges: ReplicaGaugesFn) -> None:
        """A snapshot, unless the last one is younger than MIN_INTERVAL_S; a replica that did not answer
        in time has no gauges in it."""
        async with self.lock:
            if self.last is not None and time.time() - self.last.t < MIN_INTERVAL_S:
                return
            snap = Snapshot(time.time())
            read_registry(self.registry, snap)
            urls = [u for us in urls_by_model.values() for u in us]
            if urls:
                snap.replicas = await replica_gauges(urls)
            for model, us in urls_by_model.items():
                waiting = sum(snap.replicas.get(u, {}).get("waiting", 0.0) for u in us)
                snap.queue[model] = snap.queue.get(model, 0.0) + waiting
            self.points.append(self.derive(self.last, snap))
            self.times.append(snap.t)
            self.last = snap

    @staticmethod
    def derive(prev: Snapshot | None, cur: Snapshot) -> dict[str, dict[str, float | None]]:
        """One chart point per series: rates and quantiles over the interval since `prev`."""
        p: dict[str, dict[str, float | None]] = {
            "queue_depth": dict(cur.queue), "replicas_desired": dict(cur.desired), "replicas_ready": dict(cur.ready),
            "kv_cache_usage": {u: g["kv"] for u, g in cur.replicas.items() if "kv" in g},
            # each replica's busiest GPU (or its host's CPU) and fullest device memory, 0..1
            "device_busy": {u: g["busy"] for u, g in cur.replicas.items() if "busy" in g},
            "device_memory": {u: g["memory"] for u, g in cur.replicas.items() if "memory" in g}}
        if prev is None:
            return p
        dt = max(cur.t - prev.t, 1e-6)
        p["requests_per_s"] = {m: max(0.0, n - prev.requests.get(m, 0.0)) / dt for m, n in cur.requests.items()}
        p["errors_per_s"] = {k: max(0.0, n - prev.errors.get(k, 0.0)) / dt for k, n in cur.errors.items()}
        for name, hist, old in (("ttft", cur.ttft, prev.ttft), ("itl", cur.itl, prev.itl)):
            for q in (0.5, 0.99):
                p[f"{name}_p{round(q * 100)}_s"] = {m: quantile(q, delta(b, old.get(m))) for m, b in hist.items()}
        return p

    def series(self) -> dict[str, Any]:
        """Columns for the charts: every series as one list aligned with `t` (null where it had no value)."""
        names: dict[str, set[str]] = {}
        for p in self.points:
            for name, values in p.items():
                names.setdefault(name, set()).update(values)
        out = {name: {k: [p.get(name, {}).get(k) for p in self.points] for k in sorted(keys)}
               for name, keys in names.items()}
        return {"t": list(self.times), "series": out}
