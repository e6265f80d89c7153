"""The autoscaler's metrics, each declared once: how a sample is read from an Observation, and whether
the controller must scrape the ready replicas' /metrics for it. The fleet file's `autoscaling.metric`
takes its names from here; the autoscaler, the model controller and the simulator all read this table.

This module imports nothing from argosy, so argosy/config.py can import it without a circle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Observation:
    concurrency: float  # requests in flight or held at the gateway for this model
    rps: float = 0.0  # requests finished per second since the last observation
    queue: float = 0.0  # requests waiting (gateway queue + the replicas' vllm:num_requests_waiting)
    kv_cache: float = 0.0  # mean KV-cache usage over the ready replicas, 0..1
    tokens: float = 0.0  # estimated tokens of the requests in flight or queued at the gateway (encoders)


@dataclass(frozen=True)
class ScalingMetric:
    name: str
    # The sample, in the unit of `autoscaling.target` (what one replica is sized for), from an
    # observation and the number of ready replicas.
    value_fn: Callable[[Observation, int], float]
    needs_scrape: bool  # reads vllm:* gauges: the controller scrapes the ready replicas each tick
    target_unit: str  # what `autoscaling.target` counts, per replica
    max_target: float | None = None  # the largest meaningful `target` (a fraction: 1)


def _kv_cache(o: Observation, ready: int) -> float:
    return o.kv_cache * max(ready, 1)  # total KV in use, in replicas' worth


METRICS: dict[str, ScalingMetric] = {m.name: m for m in (
    # requests in flight at the gateway plus those in its admission queue
    ScalingMetric("concurrency", lambda o, ready: o.concurrency, False, "requests"),
    # requests finished by the replicas per second since the previous sample
    ScalingMetric("rps", lambda o, ready: o.rps, False, "requests per second"),
    # the gateway's admission queue plus the ready replicas' vllm:num_requests_waiting
    ScalingMetric("queue", lambda o, ready: o.queue, True, "waiting requests"),
    # mean vllm:kv_cache_usage_perc of the ready replicas x their count
    ScalingMetric("kv_cache", _kv_cache, True, "a fraction of a replica's KV cache", max_target=1.0),
    # the estimated tokens of the requests in flight or queued at the gateway: encoders' default (their
    # requests range from one short text to thousands, so a request count says little about the work)
    ScalingMetric("tokens", lambda o, ready: o.tokens, False, "tokens in flight"),
)}
METRIC_NAMES = tuple(METRICS)
