"""The controller's Prometheus series, registered on the gateway's registry (one /metrics for both).

Names follow docs/metrics.md: `argosy_fleet_*`, base units in the name, counters exposed with `_total`.
Gauges of state (replicas by state, ready, unplaceable, held) are read from the controller when
scraped, so they never lag it; the autoscaler's outputs (desired, panic, observed) are set per decision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from argosy.fleet.model_controller import ModelController

STATES = ("starting", "warming", "ready", "draining")  # argosy_fleet_replicas' `state` label

COLD = (0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300)


class FleetMetrics:
    def __init__(self, r: CollectorRegistry) -> None:
        self.desired = Gauge("argosy_fleet_desired_replicas", "Replicas the autoscaler wants", ["model"], registry=r)
        self.actual = Gauge("argosy_fleet_actual_replicas", "Ready replicas in the routing set", ["model"],
                            registry=r)
        self.replicas = Gauge("argosy_fleet_replicas", "Replicas by state (warm pool: pooled=true)",
                              ["model", "state", "pooled"], registry=r)
        self.panic = Gauge("argosy_fleet_panic_mode", "1 while the autoscaler panics", ["model"], registry=r)
        self.observed = Gauge("argosy_fleet_observed_load", "The scaling metric averaged over a window",
                              ["model", "window"], registry=r)
        self.decisions = Counter("argosy_fleet_scaling_decisions", "Autoscaler decisions by direction and reason",
                                 ["model", "direction", "reason"], registry=r)
        self.cold_start = Histogram("argosy_fleet_cold_start_seconds", "Replica start to ready", ["model"],
                                    buckets=COLD, registry=r)
        self.restarts = Counter("argosy_fleet_replica_failures", "Replicas that died on their own", ["model"],
                                registry=r)
        self.placement_failures = Counter("argosy_fleet_placement_failures",
                                          "Replica launches refused: no node has room", ["model"], registry=r)
        self.unplaceable = Gauge("argosy_fleet_unplaceable", "1 while a wanted replica cannot be placed",
                                 ["model"], registry=r)
        self.held = Gauge("argosy_fleet_held_requests", "Requests held while a replica starts", ["model"],
                          registry=r)

    def watch(self, mc: ModelController) -> None:
        """Read one model controller's state into the state gauges at each scrape."""
        for state in STATES:
            for pooled in (True, False):
                self.replicas.labels(mc.name, state, str(pooled).lower()).set_function(
                    lambda s=state, p=pooled: mc.count(s, p))
        self.actual.labels(mc.name).set_function(lambda: len(mc.ready_routed()))
        self.unplaceable.labels(mc.name).set_function(lambda: 1 if mc.unplaceable else 0)
        self.held.labels(mc.name).set_function(lambda: mc.held)

