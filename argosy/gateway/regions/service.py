"""A region's gateway among the others (docs/regions.md): which region serves a request, and the
forwarded call when it is another one.

Per model, the candidates are the home region and every other region's gateway (RegionUpstreams); a
Router with the region filters and scorers picks one: home while it is healthy and below its saturation
threshold, else the best other region by measured latency, free capacity and price, never outside the
request's jurisdiction. A forwarded request is signed, carries its origin, residency and trace context,
and is served where it lands (one hop at most). Retries before the first byte go to the next region;
when none is left, home serves it if it can, else the caller gets 503 with Retry-After.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from argosy.config import FleetConfig, ModelConfig, RoutingConfig
from argosy.gateway.asgi import Scope, header
from argosy.gateway.errors import GatewayError, unavailable
from argosy.gateway.prefix_index import PrefixIndex
from argosy.gateway.regions.auth import RegionSigner, load_secret
from argosy.gateway.regions.outlier import RegionHealth
from argosy.gateway.regions.upstream import HOME_URL, RegionUpstream
from argosy.gateway.router import Router, RouteRequest
from argosy.gateway.routing.filters import region_filters

log = logging.getLogger("argosy.gateway")
DEFAULT_REPLICA_CONCURRENCY = 16


def replica_concurrency(m: ModelConfig) -> float:
    """Requests one replica is sized for: the autoscaler's target with the concurrency metric, else the
    engine's max_num_seqs when the file sets it."""
    if m.autoscaling.metric == "concurrency":
        return m.autoscaling.target
    return float(m.engine.max_num_seqs if "max_num_seqs" in m.engine.model_fields_set
                 else DEFAULT_REPLICA_CONCURRENCY)


@dataclass
class Inbound:
    """A request another region's gateway forwarded here (signature checked once the body is read)."""
    headers: dict[str, str]
    origin: str = ""
    residency: str | None = None


class ModelRegions:
    """One model's candidates: home first, then the other regions in the fleet file's order."""

    def __init__(self, model: ModelConfig, candidates: list[RegionUpstream], weights: dict[str, float]):
        self.model = model
        self.candidates = candidates
        self.home = candidates[0]
        self.by_region = {u.region: u for u in candidates}
        routing = RoutingConfig(scorers=weights)
        self.router = Router(routing, None, PrefixIndex(1, 1.0), filters=region_filters())
        self.router.set_upstreams(candidates)

    def choose(self, rreq: RouteRequest, tried: set[str] | frozenset[str] = frozenset()) -> RegionUpstream | None:
        return self.router.choose(rreq, tried)


class PeerRoute:
    """What the proxy routes a forwarded request with: the chosen region, then the next best on a retry
    (never home: the gateway serves home itself once no other region is left)."""

    def __init__(self, regions: ModelRegions, first: RegionUpstream):
        self.regions, self.first = regions, first

    def choose(self, rreq: RouteRequest, tried) -> RegionUpstream | None:
        if self.first.url not in tried:
            return self.first
        return self.regions.choose(rreq, {*tried, HOME_URL})


class Regions:
    def __init__(self, fleet: FleetConfig):
        cfg = self.cfg = fleet.region_routing
        self.name = fleet.gateway.region
        self.regions = {r.name: r for r in fleet.regions}
        self.here = self.regions[self.name]
        self.signer = RegionSigner(self.name, load_secret(cfg.secret_env, cfg.secret_file), cfg.max_clock_skew_s)
        weights = {"region_latency": cfg.weights.latency, "region_load": cfg.weights.load,
                   "region_price": cfg.weights.price}
        self.models: dict[str, ModelRegions] = {}
        for m in fleet.models:
            cands = [self._candidate(m, r, r.name == self.name) for r in
                     [self.here, *(r for r in fleet.regions if r.name != self.name)]]
            self.models[m.name] = ModelRegions(m, cands, weights)
        self.here_headers = [(b"x-argosy-region", self.name.encode())]

    def _candidate(self, m: ModelConfig, region, home: bool) -> RegionUpstream:
        c = self.cfg
        health = RegionHealth(c.outlier_failures, c.stale_after_s, c.hold_down_s, c.ramp_s)
        if home:
            health.ok()  # home starts in; the other regions once their first state arrives
        allowed = m.regions is None or region.name in m.regions
        return RegionUpstream(region.name, region.gateway, region.jurisdiction, health, home=home,
                              spill_at=region.spill_at or c.spill_at, usd_per_hour=list_price(region),
                              allowed=allowed)

    def peers(self) -> list:
        return [r for name, r in self.regions.items() if name != self.name]

    # ------------------------------------------------------------------ a request that arrives

    def inbound(self, scope: Scope) -> Inbound | None:
        """A call signed by another region's gateway (checked by `verify` once the body is read), or None."""
        if header(scope, b"x-argosy-region-sig") is None:
            return None
        return Inbound({k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                        if k.startswith(b"x-argosy-")})

    def verify(self, inbound: Inbound, path: str, body: bytes) -> None:
        sender = self.signer.verify(inbound.headers, "POST", path, body)
        if sender not in self.regions or sender == self.name:
            raise GatewayError(401, f"gateway-to-gateway call refused: {sender!r} is not another region",
                               "authentication_error", "region_auth_failed")
        inbound.origin = sender
        inbound.residency = inbound.headers.get("x-argosy-residency") or None

    def residency(self, scope: Scope, key_residency: str | None) -> str | None:
        """The request's jurisdiction: its key's, or the operator-allowed header's (which may not widen a
        key's pin); an unknown jurisdiction is a 400."""
        name = self.cfg.residency_header
        asked = header(scope, name.encode()) if name else None
        if asked is None:
            return key_residency
        value = asked.decode(errors="replace").strip().lower()
        known = {r.jurisdiction for r in self.regions.values()}
        if value not in known:
            raise GatewayError(400, f"{name}: {value!r} is no region's jurisdiction ({', '.join(sorted(known))})",
                               "invalid_request_error", "unknown_jurisdiction", name)
        if key_residency is not None and value != key_residency:
            raise GatewayError(403, f"{name}: this API key is pinned to {key_residency!r}", "permission_error",
                               "residency_not_allowed", name)
        return value

    def observe_home(self, rt) -> bool:
        """Home's load and capacity for one model (a ModelRuntime) now; whether it has a live replica."""
        home = self.models[rt.name].home
        ups = {u.url: u for r in rt.routers.values() for u in r.upstreams}.values()
        live = sum(1 for u in ups if u.available())
        load = rt.admission_load()
        home.report(load.in_flight + load.waiting, live * replica_concurrency(rt.cfg), home.spill_at,
                    home.usd_per_hour)
        return live > 0

    def place(self, model: str, rreq: RouteRequest, inbound: Inbound | None, home_live: bool
              ) -> tuple[RegionUpstream | None, str]:
        """(None to serve here, or the region to forward to; the reason). Raises 503 with Retry-After when
        no region of the request's jurisdiction can serve it."""
        mr = self.models[model]
        home = mr.home
        if inbound is not None:  # one hop at most: served here, or refused if it may not be
            if rreq.residency is not None and home.jurisdiction != rreq.residency:
                raise self.refuse(model, rreq.residency, "forwarded here from outside the jurisdiction")
            return None, "forwarded_in"
        if not home_live and home.allowed:
            home.health.fail(at_once=True)  # out at once: its arrivals fail over, it returns through the hold-down
        chosen = mr.choose(rreq)
        if chosen is not None and not chosen.home:
            return chosen, self.reason(home, rreq, home_live)
        if chosen is not None or self.home_can_serve(home, rreq, home_live):
            return None, "home"
        raise self.refuse(model, rreq.residency, "no region can serve it")

    def home_can_serve(self, home: RegionUpstream, rreq: RouteRequest, home_live: bool) -> bool:
        """Home as the last resort: it runs the model, has a live replica and is in the jurisdiction."""
        return home.allowed and home_live and (rreq.residency is None or home.jurisdiction == rreq.residency)

    def reason(self, home: RegionUpstream, rreq: RouteRequest, home_live: bool) -> str:
        if not home.allowed:
            return "not_here"
        if rreq.residency is not None and home.jurisdiction != rreq.residency:
            return "residency"
        if not home_live or home.health.share() < 1.0:
            return "failover"
        return "spill"

    def refuse(self, model: str, residency: str | None, why: str) -> GatewayError:
        where = f"in jurisdiction {residency!r}" if residency else "anywhere"
        return unavailable(f"model {model!r}: no region {where} can serve this request now ({why}); retry later",
                           "no_region", retry_after=self.cfg.retry_after_s)

    def forward_headers(self, base: Mapping[str, str], path: str, body: bytes, residency: str | None,
                        key_name: str | None) -> dict[str, str]:
        fields = {"x-argosy-forwarded-from": self.name, "x-argosy-residency": residency or "",
                  "x-argosy-key": key_name or ""}
        return {**base, **self.signer.sign("POST", path, body, fields)}


def list_price(region) -> float:
    """$/h of the first capacity kind the region has any of (reserved before on-demand before spot): what
    its replicas cost until its controller says what they run on."""
    for kind in ("reserved", "on_demand", "spot"):
        c = region.capacity.get(kind)
        if c is not None and c.count > 0:
            return c.usd_per_hour
    return 0.0
