"""A region as a routing candidate for one model: the gateway's Router picks regions with the same
filters-scorers-picker pipeline it uses for replicas (gateway/routing: RegionLiveFilter, ResidencyFilter,
HomeFirstFilter; region_latency, region_load and region_price). The simulator builds the same objects
from its own state, so both decide who serves what with one piece of code.

`in_flight` (inherited) counts this gateway's requests forwarded there now; the region's own count comes
with its state every exchange, and the estimate between two exchanges adds what this gateway sent since.
"""

from __future__ import annotations

from argosy.gateway.health import Upstream
from argosy.gateway.regions.outlier import RegionHealth

HOME_URL = "region:home"  # the home region's candidate is never forwarded to


class RegionUpstream(Upstream):
    __slots__ = ("region", "jurisdiction", "home", "health", "rtt_s", "reported_in_flight", "own_at_report",
                 "capacity", "spill_at", "usd_per_hour", "reply_headers", "allowed")

    def __init__(self, region: str, url: str, jurisdiction: str, health: RegionHealth, home: bool = False,
                 spill_at: float = 1.0, usd_per_hour: float = 0.0, allowed: bool = True):
        # The breaker never opens on its own (a huge eject_after): RegionHealth is the outlier detector.
        super().__init__(HOME_URL if home else url, eject_after=1 << 30)
        self.region, self.jurisdiction, self.home, self.health = region, jurisdiction, home, health
        self.rtt_s = 0.0  # measured round trip (median of the last exchanges); 0 at home
        self.reported_in_flight = 0.0  # requests in flight there for this model, at its last state
        self.own_at_report = 0  # this gateway's forwarded requests in flight there at that moment
        self.capacity = 0.0  # live replicas x per-replica concurrency, at its last state
        self.spill_at, self.usd_per_hour, self.allowed = spill_at, usd_per_hour, allowed
        self.reply_headers = ((b"x-argosy-region", region.encode()),)

    def estimated_in_flight(self) -> float:
        return self.reported_in_flight + max(self.in_flight - self.own_at_report, 0)

    def load_share(self) -> float:
        """Requests in flight there as a share of its capacity (inf with no capacity)."""
        n = self.estimated_in_flight()
        return n / self.capacity if self.capacity > 0 else float("inf")

    def saturated(self) -> bool:
        return self.load_share() >= self.spill_at

    def report(self, in_flight: float, capacity: float, spill_at: float, usd_per_hour: float) -> None:
        self.reported_in_flight, self.capacity = in_flight, capacity
        self.spill_at, self.usd_per_hour = spill_at, usd_per_hour
        self.own_at_report = self.in_flight

    # A forwarded request that failed before its first byte is a failure of the region (passive outlier
    # detection); the breaker itself stays closed.
    def failure(self, passive: bool = True) -> None:
        super().failure(passive)
        self.health.fail()

    def available(self, now: float | None = None) -> bool:
        return self.allowed and self.health.share() > 0

    def snapshot(self) -> dict:
        return {"region": self.region, "home": self.home, "jurisdiction": self.jurisdiction,
                "rtt_ms": round(self.rtt_s * 1000, 2), "in_flight": round(self.estimated_in_flight(), 2),
                "forwarded_in_flight": self.in_flight, "capacity": self.capacity,
                "load_share": round(self.load_share(), 3) if self.capacity else None,
                "saturated": self.saturated(), "usd_per_hour": self.usd_per_hour, "allowed": self.allowed,
                "served": self.served, "failed": self.failed, **self.health.snapshot()}
