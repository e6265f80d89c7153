"""A replica's record: which model, where it runs, its URL and its state.

    starting -> warming -> ready -> draining -> stopped
starting: the process (or actor) is being launched; warming: it listens but `/ready` is not yet 200
(loading, warm-up request); ready: it may take traffic (in the routing set unless it waits in the
warm pool); draining: out of the routing set, finishing its streams. `failed`: it died on its own.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from argosy.fleet.placement import Placement

STARTING, WARMING, READY, DRAINING, STOPPED, FAILED = "starting", "warming", "ready", "draining", "stopped", "failed"
LIVE = (STARTING, WARMING, READY)
_ids = itertools.count(1)


@dataclass
class ReplicaSpec:
    """What a provider needs to start one replica."""
    model: str  # the served model name
    checkpoint: str
    engine_args: list[str]  # `argosy engine` flags beyond model/name/host/port
    placement: Placement | None = None
    env: dict[str, str] = field(default_factory=dict)
    stages: int = 1  # pipeline stages, each on a node of its own (kubernetes: a LeaderWorkerSet group)


@dataclass
class Replica:
    model: str
    spec: ReplicaSpec
    pooled: bool = False  # a warm-pool replica: ready but not in the routing set
    revision: str = ""  # the model revision it runs (argosy.config.ModelConfig.resolved)
    id: str = field(default_factory=lambda: f"r{next(_ids)}")
    state: str = STARTING
    url: str | None = None
    created: float = field(default_factory=time.monotonic)
    ready_at: float | None = None
    handle: Any = None  # the provider's (a process, an actor)
    task: Any = None  # the controller's task that runs this replica
    log_task: Any = None  # the provider's output reader, if any
    detail: str = ""  # last error, drain progress

    @property
    def node(self) -> str | None:
        return self.spec.placement.node if self.spec.placement else None

    def snapshot(self, in_flight: int = 0) -> dict:
        now = time.monotonic()
        return {"id": self.id, "model": self.model, "revision": self.revision, "state": self.state, "url": self.url,
                "node": self.node,
                "gpus": list(self.spec.placement.gpus) if self.spec.placement else [], "pooled": self.pooled,
                "in_flight": in_flight, "age_s": round(now - self.created, 1),
                "cold_start_s": round(self.ready_at - self.created, 2) if self.ready_at else None,
                "detail": self.detail}
