"""Capacity kinds in one region (docs/regions.md): which kind each node is (reserved, on_demand, spot), the
order the controller fills them in (`region_routing.capacity_order`: reserved first, then on-demand, then
spot for bursts, by default), how many units of each kind the region has (`regions[].capacity`), and what
each replica costs per hour.

A unit is a GPU, or one CPU replica on a CPU node; a replica costs its units x its kind's $/h. A kind left
out of the order is never placed on; a kind without a `capacity` entry is bounded by its nodes alone.
The Placer asks `usable` and `rank` for each node (placement.py); nodes under a preemption notice are
cordoned there (preemption.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from argosy.config import FleetConfig
from argosy.config_regions import CPU_UNIT, CapacityConfig


def units(gpus: int) -> int:
    return max(gpus, 1)


@dataclass
class CapacityBook:
    region: str
    provider: str  # the cloud or site
    kind_of: dict[str, str]  # node name -> capacity kind
    order: list[str]
    limits: dict[str, CapacityConfig] = field(default_factory=dict)

    @classmethod
    def of(cls, fleet: FleetConfig) -> CapacityBook | None:
        """The book of the region this controller runs in (None: a fleet without regions)."""
        name = fleet.gateway.region
        region = next((r for r in fleet.regions if r.name == name), None)
        if region is None:
            return None
        return cls(region.name, region.provider, {n.name: n.capacity for n in region.nodes},
                   list(fleet.region_routing.capacity_order), dict(region.capacity))

    def kind(self, node: str) -> str | None:
        return self.kind_of.get(node)

    def rank(self, node: str) -> int:
        kind = self.kind_of.get(node)
        return self.order.index(kind) if kind in self.order else len(self.order)

    def used(self, held: list[tuple[str, int]]) -> dict[str, int]:
        """Units in use per kind, from (node, GPUs) of every placed replica."""
        out: dict[str, int] = {}
        for node, gpus in held:
            kind = self.kind_of.get(node)
            if kind is not None:
                out[kind] = out.get(kind, 0) + units(gpus)
        return out

    def usable(self, node: str, gpus: int, used: dict[str, int]) -> bool:
        """Whether one more replica of `gpus` GPUs may go on this node: its kind is in the order and has
        units left (a node of no listed region places freely)."""
        kind = self.kind_of.get(node)
        if kind is None:
            return True
        if kind not in self.order:
            return False
        limit = self.limits.get(kind)
        return limit is None or used.get(kind, 0) + units(gpus) <= limit.count

    def usd_per_hour(self, node: str | None, gpus: int) -> float | None:
        kind = self.kind_of.get(node or "")
        limit = self.limits.get(kind or "")
        if limit is None:
            return None
        if gpus == 0 and limit.gpu != CPU_UNIT:
            return None  # a CPU replica on capacity priced per GPU: no honest figure
        return round(units(gpus) * limit.usd_per_hour, 4)

    def describe(self, replica: dict) -> dict:
        """A replica's region, provider, capacity kind and $/h (for status and the dashboard)."""
        gpus = len(replica.get("gpus") or [])
        return {"region": self.region, "provider": self.provider, "capacity_kind": self.kind(replica.get("node") or ""),
                "usd_per_hour": self.usd_per_hour(replica.get("node"), gpus)}


def summary(replicas: list[dict]) -> dict:
    """Replicas (with `describe`'s fields) counted and priced by region, provider and capacity kind."""
    groups: dict[tuple, dict] = {}
    for r in replicas:
        if r.get("state") not in ("starting", "warming", "ready", "draining"):
            continue
        key = (r.get("region"), r.get("provider"), r.get("capacity_kind"))
        g = groups.setdefault(key, {"region": key[0], "provider": key[1], "capacity_kind": key[2], "replicas": 0,
                                    "usd_per_hour": 0.0})
        g["replicas"] += 1
        g["usd_per_hour"] = round(g["usd_per_hour"] + (r.get("usd_per_hour") or 0.0), 4)
    return {"groups": list(groups.values()),
            "usd_per_hour": round(sum(g["usd_per_hour"] for g in groups.values()), 4)}
