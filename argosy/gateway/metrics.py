"""Prometheus metrics, per model, route (the traffic revision), upstream and key class, in a registry per gateway.

Names follow docs/metrics.md: `argosy_gateway_*`, base units in the name (`_seconds`), counters exposed
with `_total`. `key_class` is the API key's priority class (`interactive`, `batch`; `none` when the
fleet has no keys), never the key or its name: bounded cardinality, no secrets in labels.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
        self.queue_depth = Gauge("argosy_gateway_queue_depth", "Requests waiting for admission", ["model"],
                                 registry=r)
        self.in_flight = Gauge("argosy_gateway_in_flight", "Admitted requests in flight", ["model"], registry=r)
        self.queue_wait = Histogram("argosy_gateway_queue_wait_seconds", "Time spent waiting for admission",
                                    ["model"], buckets=LAT, registry=r)
        self.rejections = Counter("argosy_gateway_rejections", "Requests refused, by reason",
                                  ["model", "reason", "key_class"], registry=r)
        self.retries = Counter("argosy_gateway_retries", "Requests retried on another upstream", ["model", "upstream"],
                               registry=r)
        self.healthy = Gauge("argosy_gateway_upstream_healthy", "1 if the upstream's breaker is closed", ["upstream"],
                             registry=r)
        self.upstream_in_flight = Gauge("argosy_gateway_upstream_in_flight", "Gateway requests in flight",
                                        ["upstream"], registry=r)
        self.shadow = Counter("argosy_gateway_shadow_requests", "Shadow requests by outcome", ["model", "outcome"],
                              registry=r)
        self.shadow_latency = Histogram("argosy_gateway_shadow_e2e_seconds", "Shadow request latency", ["model"],
                                        buckets=LAT, registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
