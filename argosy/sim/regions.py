"""Which region serves a simulated request, decided by the gateway's own region routing (docs/regions.md).

For a fleet file with `regions`, each simulated region is a RegionUpstream candidate, as a region's
gateway sees the others, and the gateway's Router with the region filters and scorers picks the serving
region: home while it is healthy and below its saturation threshold, else the best other region by round
trip (the traffic file's rtt_s: what the gateways would measure), free capacity and price. A region that
fails is out at once (the gateways' outlier detection takes about a second: not modelled) and comes back
through the same hold-down and ramp. The simulation knows every region's state at once: one view, shared.
"""

from __future__ import annotations

import random

from argosy.config import FleetConfig, ModelConfig, RoutingConfig
from argosy.gateway.prefix_index import PrefixIndex
from argosy.gateway.regions.outlier import RegionHealth
from argosy.gateway.regions.service import list_price, replica_concurrency
from argosy.gateway.regions.upstream import RegionUpstream
from argosy.gateway.router import Router, RouteRequest
from argosy.gateway.routing.filters import region_filters
from argosy.sim.traffic import TrafficSpec


class SimRegions:
    def __init__(self, fleet: FleetConfig, model: ModelConfig, spec: TrafficSpec, clock, seed: int = 0):
        cfg = fleet.region_routing
        by_name = {r.name: r for r in fleet.regions}
        self.names = [r.name for r in spec.regions]
        missing = [n for n in self.names if n not in by_name]
        if missing:
            raise ValueError(f"traffic regions {missing} are not regions of the fleet file "
                             f"({', '.join(by_name) or 'none'})")
        self.concurrency = replica_concurrency(model)
        self.health = [RegionHealth(cfg.outlier_failures, float("inf"), cfg.hold_down_s, cfg.ramp_s, clock)
                       for _ in self.names]
        for h in self.health:
            h.ok()
        weights = {"region_latency": cfg.weights.latency, "region_load": cfg.weights.load,
                   "region_price": cfg.weights.price}
        rng = random.Random(seed)
        self.views: list[list[RegionUpstream]] = []
        self.routers: list[Router] = []
        for i, home in enumerate(self.names):
            order = [i, *(j for j in range(len(self.names)) if j != i)]
            cands = []
            for j in order:
                r = by_name[self.names[j]]
                u = RegionUpstream(r.name, r.gateway, r.jurisdiction, self.health[j], home=j == i,
                                   spill_at=r.spill_at or cfg.spill_at, usd_per_hour=list_price(r),
                                   allowed=model.regions is None or r.name in model.regions)
                u.rtt_s = spec.rtt(home, r.name)
                cands.append(u)
            router = Router(RoutingConfig(scorers=weights), None, PrefixIndex(1, 1.0),
                            filters=region_filters(rng.random))
            router.set_upstreams(cands)
            self.views.append(cands)
            self.routers.append(router)

    def update(self, idx: int, healthy: bool, in_flight: float, replicas: int) -> None:
        """One region's state now (what its gateway would report)."""
        h = self.health[idx]
        if healthy:
            h.ok()
        else:
            h.fail(at_once=True)
        for view in self.views:
            u = next(u for u in view if u.region == self.names[idx])
            u.report(in_flight, replicas * self.concurrency, u.spill_at, u.usd_per_hour)

    def choose(self, arrival: int, residency: str | None = None) -> int | None:
        """The index of the serving region (None: no region can serve it now)."""
        view = self.views[arrival]
        u = self.routers[arrival].choose(RouteRequest("", 0, residency=residency))
        if u is None:
            home = view[0]
            return arrival if home.allowed and self.health[arrival].state != "out" and home.capacity > 0 else None
        return self.names.index(u.region)
