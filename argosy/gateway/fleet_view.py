"""What the gateway shows of the fleet controller under `argosy serve` (argosy.fleet.controller.Controller
implements it; the gateway is handed one through Gateway.attach_fleet)."""

from __future__ import annotations

from typing import Protocol


class FleetView(Protocol):
    def status(self) -> dict:
        """Nodes, models, replicas, recent decisions: GET /admin/fleet, `argosy status`."""

    def decisions(self) -> list[dict]:
        """The autoscalers' recent decisions that changed something."""

    def targets(self) -> list[dict]:
        """Replicas that listen: {url, model, replica, state, pooled}."""

    def preempt(self, node: str, deadline_s: float, source: str = "admin", restore: bool = False) -> dict:
        """A preemption notice for a node, or its return (KeyError: no such node)."""
    def rollout_status(self, model: str | None = None) -> list[dict]:
        """Each managed model's stable revision, split and rollout (GET /admin/rollouts, the dashboard)."""

    async def rollout_command(self, model: str, verb: str, body: dict) -> dict:
        """start {to, strategy}, promote {full}, pause, resume, abort {reason}: the model's rollout status
        after it; a GatewayError (400, 404, 409) when it cannot be done."""
