"""Prometheus series of the regions (docs/metrics.md): where requests were served and why, and each
region as this gateway sees it, read when scraped."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from argosy.gateway.regions.service import Regions


class RegionMetrics:
    def __init__(self, registry: CollectorRegistry, regions: Regions | None):
        # reason: home, forwarded_in (another region sent it), spill (home saturated), failover (home out),
        # residency (home outside the request's jurisdiction), not_here (the model does not run here),
        # fallback (every other region failed before answering: home served it), refused (503: none can).
        self.requests = Counter("argosy_gateway_region_requests", "Requests by the region that served them and why",
                                ["model", "region", "reason"], registry=registry)
        if regions is not None:
            registry.register(RegionCollector(regions))


class RegionCollector(Collector):
    def __init__(self, regions: Regions):
        self.regions = regions

    def collect(self) -> Iterator[Metric]:
        rtt = GaugeMetricFamily("argosy_gateway_region_rtt_seconds", "Measured round trip to the region's gateway",
                                labels=["region"])
        share = GaugeMetricFamily("argosy_gateway_region_share", "Share of traffic the region may take "
                                  "(0 out or held down, 1 in, between while ramping back)", labels=["model", "region"])
        load = GaugeMetricFamily("argosy_gateway_region_load", "Requests in flight over capacity, as last known",
                                 labels=["model", "region"])
        seen = set()
        for model, mr in self.regions.models.items():
            for u in mr.candidates:
                if u.region not in seen:
                    seen.add(u.region)
                    rtt.add_metric([u.region], u.rtt_s)
                share.add_metric([model, u.region], u.health.share() if u.allowed else 0.0)
                if u.capacity:
                    load.add_metric([model, u.region], u.load_share())
        yield from (rtt, share, load)
