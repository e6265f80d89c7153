"""Prometheus metrics, per model, route (the traffic revision) and upstream, in a registry per gateway."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LAT = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)
ITL = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1)


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        mru = ["model", "route", "upstream"]
        self.requests = Counter("argosy_gateway_requests", "Requests by final status", [*mru, "status"], registry=r)
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
        self.rejections = Counter("argosy_gateway_rejections", "Requests refused, by reason", ["model", "reason"],
                                  registry=r)
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
