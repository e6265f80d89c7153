"""Prometheus metrics, per model, route (the traffic revision), upstream and key class, in a registry per gateway.

Names follow docs/metrics.md: `argosy_gateway_*`, base units in the name (`_seconds`), counters exposed
with `_total`. `key_class` is the API key's priority class (`interactive`, `batch`; `none` when the
fleet has no keys), never the key or its name: bounded cardinality, no secrets in labels.

Gauges of state (queue depth, in flight, each upstream's health and in-flight count) are read from
that state when scraped (StateCollector): nothing sets them, so none can be left stale by a path that
forgot to, and an upstream that is gone is gone from /metrics too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from argosy.gateway.admission import AdmissionLoad
from argosy.gateway.health import CLOSED, Upstream

LAT = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)
ITL = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1)


class GatewayMetrics:
    def __init__(self) -> None:
        # No *_created series (a gauge per labelled counter/histogram, doubling the series count); as the
        # replica server does. A process-wide switch: the gateway process owns its process.
        prometheus_client.disable_created_metrics()
        r = self.registry = CollectorRegistry()
        mru = ["model", "route", "upstream"]
        self.requests = Counter("argosy_gateway_requests", "Requests by final status", [*mru, "status", "key_class"],
                                registry=r)
        self.ttft = Histogram("argosy_gateway_ttft_seconds", "Time to the first streamed byte", mru, buckets=LAT,
                              registry=r)
        self.itl = Histogram("argosy_gateway_inter_token_seconds", "Time between streamed chunks", mru,
                             buckets=ITL, registry=r)
        self.e2e = Histogram("argosy_gateway_e2e_seconds", "End-to-end request latency", mru, buckets=LAT,
                             registry=r)
        self.queue_wait = Histogram("argosy_gateway_queue_wait_seconds", "Time spent waiting for admission",
                                    ["model"], buckets=LAT, registry=r)
        self.rejections = Counter("argosy_gateway_rejections", "Requests refused, by reason",
                                  ["model", "reason", "key_class"], registry=r)
        self.retries = Counter("argosy_gateway_retries", "Requests retried on another upstream", ["model", "upstream"],
                               registry=r)
        self.shadow = Counter("argosy_gateway_shadow_requests", "Shadow requests by outcome", ["model", "outcome"],
                              registry=r)
        self.shadow_latency = Histogram("argosy_gateway_shadow_e2e_seconds", "Shadow request latency", ["model"],
                                        buckets=LAT, registry=r)
        tasks = Gauge("argosy_gateway_asyncio_tasks", "Asyncio tasks in the gateway's event loop (leak checks)",
                      registry=r)
        tasks.set_function(lambda: len(asyncio.all_tasks()))  # read at scrape time, in the loop's thread

    def watch(self, admission: Callable[[], Iterable[tuple[str, AdmissionLoad]]],
              upstreams: Callable[[], Iterable[Upstream]]) -> None:
        """Read the models' admission and the upstreams' state into the state gauges at each scrape."""
        self.registry.register(StateCollector(admission, upstreams))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class StateCollector(Collector):
    def __init__(self, admission: Callable[[], Iterable[tuple[str, AdmissionLoad]]],
                 upstreams: Callable[[], Iterable[Upstream]]):
        self.admission, self.upstreams = admission, upstreams

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily("argosy_gateway_queue_depth", "Requests waiting for admission", labels=["model"])
        in_flight = GaugeMetricFamily("argosy_gateway_in_flight", "Admitted requests in flight", labels=["model"])
        for model, load in self.admission():
            depth.add_metric([model], load.waiting)
            in_flight.add_metric([model], load.in_flight)
        healthy = GaugeMetricFamily("argosy_gateway_upstream_healthy", "1 if the upstream's breaker is closed",
                                    labels=["upstream"])
        up_in_flight = GaugeMetricFamily("argosy_gateway_upstream_in_flight", "Gateway requests in flight",
                                         labels=["upstream"])
        for u in list(self.upstreams()):
            healthy.add_metric([u.url], 1.0 if u.state == CLOSED else 0.0)
            up_in_flight.add_metric([u.url], u.in_flight)
        yield from (depth, in_flight, healthy, up_in_flight)
