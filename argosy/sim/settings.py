"""How a fleet simulation runs (FleetSim): fixed or autoscaled replicas, timeline resolution, warm starts,
and CPU replicas sharing a node's cores."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SimSettings:
    replicas: int | None = None  # fixed replicas per region; None: the autoscaler decides
    replicas_by_region: tuple[tuple[str, int], ...] = ()  # with `replicas`: these regions' own fixed counts
    sample_s: float = 1.0  # timeline resolution
    drain_limit_s: float = 600.0  # after the last arrival, stop simulating in-flight requests after this
    initial_replicas: tuple[tuple[str, int], ...] = ()  # (region, ready replicas at t=0) with the autoscaler
    # Replicas started before this time are ready at once: a week level's warm-up stands for the hours
    # before it, in which the autoscaler had time to follow the slow diurnal change.
    instant_start_until_s: float = 0.0
    # CPU replicas sharing one node of this many cores (sim/shared_node.py); None: each has its own hardware.
    node_cores: float | None = None
    replica_threads: float = 1.0
