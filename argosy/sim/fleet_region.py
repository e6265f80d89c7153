"""One region of a simulated fleet: its gateway's real Router (with its prefix index), its autoscaler, its
replicas, and the requests held while none is ready."""

from __future__ import annotations

from collections.abc import Iterator

from argosy.config import ModelConfig
from argosy.fleet.autoscaler import Autoscaler
from argosy.gateway.health import Upstream
from argosy.gateway.prefix_index import PrefixIndex
from argosy.gateway.router import Router
from argosy.sim.replica import SimReplica, SimRequest


class Region:
    def __init__(self, idx: int, name: str, model: ModelConfig, clock):
        self.idx, self.name = idx, name
        r = model.routing
        self.router = Router(r, model.length_classes, PrefixIndex(r.prefix_max_blocks, r.prefix_ttl_s, clock))
        self.scaler: Autoscaler | None = None
        self.replicas: list[SimReplica] = []  # starting, ready and draining
        self.upstreams: dict[str, Upstream] = {}
        self.pending: list[SimRequest] = []  # held while no replica is ready (scale from zero, cold start)
        self.down = False
        self.finished_since_tick = 0

    def routable(self) -> list[SimReplica]:
        return [r for r in self.replicas if r.name in self.upstreams]

    def in_flight(self) -> Iterator[SimRequest]:
        """Requests here that are neither finished nor failed: held for a replica, or on one."""
        yield from self.pending
        for rep in self.replicas:
            yield from rep.requests.values()
