"""The fleet file's regions: `regions:` (where the fleet runs: provider, location, jurisdiction, gateway,
nodes, capacity by kind) and `region_routing:` (how the regions' gateways share traffic). docs/regions.md.

A leaf module (pydantic only): argosy/config.py builds the region's node list on its NodeConfig and
checks the names that cross sections (models' regions, keys' residency, gateway.region).
Every default is written here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from argosy.config_section import ConfigSection

CAPACITY_KINDS = ("reserved", "on_demand", "spot")
CapacityKind = Literal["reserved", "on_demand", "spot"]
CPU_UNIT = "cpu"  # a capacity entry of CPU replica slots: `count` replicas, `usd_per_hour` each




class CapacityConfig(ConfigSection):
    """One kind of capacity in a region: `count` GPUs of type `gpu` at `usd_per_hour` each (per GPU-hour).
    With `gpu: cpu` the units are CPU replicas (count of them, price per replica-hour)."""
    gpu: str = Field(min_length=1)
    count: int = Field(ge=0)
    usd_per_hour: float = Field(ge=0)


class RegionSection(ConfigSection):
    """One region; argosy/config.py's RegionConfig adds `nodes` (NodeConfig + a capacity kind)."""
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    provider: str = Field(min_length=1)  # the cloud or site: aws, gcp, coreweave, onprem (any name)
    location: str = ""  # e.g. europe-west4, us-east-1, a city
    jurisdiction: str = Field(min_length=1)  # where its data is processed, for residency: eu, us, in, ...
    gateway: str  # its gateway's URL, as the other regions' gateways reach it
    capacity: dict[CapacityKind, CapacityConfig] = {}
    # A gateway-only model's upstreams in this region (model name -> URLs), instead of models[].upstreams.
    upstreams: dict[str, list[str]] = {}
    spill_at: float | None = Field(None, gt=0)  # this region's saturation threshold (default: region_routing's)

    @field_validator("gateway")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"gateway {v!r} is not an http(s) URL")
        return v.rstrip("/")

    @field_validator("upstreams")
    @classmethod
    def _upstream_urls(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for model, urls in v.items():
            for u in urls:
                if not u.startswith(("http://", "https://")):
                    raise ValueError(f"upstreams.{model}: {u!r} is not an http(s) URL")
        return {m: [u.rstrip("/") for u in urls] for m, urls in v.items()}


class RegionWeights(ConfigSection):
    """The region scorers' weights when a request leaves its region (gateway/routing/scorers.py)."""
    latency: float = Field(1.0, ge=0)  # the lowest measured round trip
    load: float = Field(1.0, ge=0)  # the most free capacity (share of the region's capacity not in use)
    price: float = Field(0.25, ge=0)  # the cheapest capacity kind running there ($/h per replica)


class RegionRoutingConfig(ConfigSection):
    exchange_interval_s: float = Field(1.0, gt=0)  # gateways exchange health, load and free capacity this often
    exchange_timeout_s: float = Field(1.0, gt=0)
    # A region's model is saturated when requests in flight there reach spill_at x its capacity (live replicas
    # x per-replica concurrency: the model's autoscaling.target with the concurrency metric, else its
    # engine.max_num_seqs); a saturated region's new arrivals go to another region.
    spill_at: float = Field(1.0, gt=0)
    outlier_failures: int = Field(3, ge=1)  # consecutive failed exchanges or forwards that take a region out
    stale_after_s: float = Field(3.0, gt=0)  # no fresh state for this long takes a region out
    hold_down_s: float = Field(10.0, ge=0)  # a region that was out must be healthy this long before it returns
    ramp_s: float = Field(10.0, ge=0)  # then its share of the traffic sent to it ramps from 0 to 1 over this
    residency_header: str | None = None  # e.g. x-argosy-residency: callers may pin themselves (null: keys only)
    secret_env: str = "ARGOSY_REGION_SECRET"  # the shared secret that signs gateway-to-gateway calls
    secret_file: str | None = None  # or a file holding it (read at start)
    max_clock_skew_s: float = Field(30.0, gt=0)  # a signed call older (or newer) than this is refused
    retry_after_s: float = Field(5.0, gt=0)  # Retry-After of a 503 when no region of the jurisdiction can serve
    weights: RegionWeights = RegionWeights()
    capacity_order: list[CapacityKind] = list(CAPACITY_KINDS)  # where the controller places replicas first

    @field_validator("capacity_order")
    @classmethod
    def _order(cls, v: list[str]) -> list[str]:
        if sorted(v) != sorted(set(v)) or not v:
            raise ValueError(f"capacity_order lists each kind at most once (kinds: {', '.join(CAPACITY_KINDS)})")
        return v

    @model_validator(mode="after")
    def _header(self) -> RegionRoutingConfig:
        if self.residency_header is not None:
            self.residency_header = self.residency_header.lower()
        return self


def check_regions(regions: list, models: list, keys: list, gateway_region: str | None) -> None:
    """The names that cross sections: unique regions and gateways, models' regions, keys' residency."""
    names = [r.name for r in regions]
    if len(names) != len(set(names)):
        raise ValueError("regions: region names must be unique")
    urls = [r.gateway for r in regions]
    if len(urls) != len(set(urls)):
        raise ValueError("regions: each region has its own gateway URL")
    jurisdictions = {r.jurisdiction for r in regions}
    for m in models:
        for r in m.regions or []:
            if r not in names:
                raise ValueError(f"models.{m.name}.regions: {r!r} is not a region ({', '.join(names) or 'none'})")
    for r in regions:
        for model in r.upstreams:
            if model not in {m.name for m in models}:
                raise ValueError(f"regions.{r.name}.upstreams: no model {model!r}")
    for k in keys:
        if k.residency is not None and regions and k.residency not in jurisdictions:
            raise ValueError(f"keys.{k.name}.residency: {k.residency!r} is no region's jurisdiction "
                             f"({', '.join(sorted(jurisdictions))})")
    if gateway_region is not None and gateway_region not in names:
        raise ValueError(f"gateway.region: {gateway_region!r} is not a region ({', '.join(names) or 'none'})")
    node_names = [n.name for r in regions for n in r.nodes]
    if len(node_names) != len(set(node_names)):
        raise ValueError("regions: node names must be unique across regions")


def region_view(fleet, name: str):
    """The fleet as region `name`'s gateway and controller run it: gateway.region set; the region's nodes
    (when it lists any) as the nodes; a gateway-only model's upstreams from `regions[].upstreams`; a model
    that may not run here has no upstreams here (the gateway forwards it, the controller leaves it)."""
    region = next((r for r in fleet.regions if r.name == name), None)
    if region is None:
        raise ValueError(f"--region {name!r} is not a region of the fleet file "
                         f"({', '.join(r.name for r in fleet.regions) or 'it has none'})")
    models = []
    for m in fleet.models:
        update = {}
        if m.regions is not None and name not in m.regions:
            update["upstreams"] = []
        elif m.name in region.upstreams:
            update["upstreams"] = region.upstreams[m.name]
        models.append(m.model_copy(update=update))
    gateway = fleet.gateway.model_copy(update={"region": name})
    return fleet.model_copy(update={"gateway": gateway, "models": models,
                                    "nodes": list(region.nodes) if region.nodes else fleet.nodes})
