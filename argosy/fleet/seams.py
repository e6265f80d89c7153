"""What the fleet controller needs from the gateway and from a provider, as Protocols.

The gateway implements ModelRoutes (argosy.gateway.traffic.ModelRuntime) and GatewayPort
(argosy.gateway.app.Gateway); providers implement ReplicaProvider (local.LocalProvider,
ray_provider.RayProvider). The controller reaches the other side only through these.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import aiohttp
    from prometheus_client import CollectorRegistry

    from argosy.fleet.placement import Node
    from argosy.fleet.replica import Replica
    from argosy.gateway.admission import AdmissionLoad
    from argosy.gateway.fleet_view import FleetView
    from argosy.gateway.revision_stats import WindowStats
    from argosy.gateway.scraper import ReplicaScraper
    from argosy.gateway.upstream_auth import UpstreamAuth


class ModelRoutes(Protocol):
    """One model's routing sets and load, as the gateway keeps them."""

    def add_upstream(self, url: str, revision: str | None = None) -> None:
        """Route to this replica (the model's own revision unless one is named)."""

    def remove_upstream(self, url: str) -> bool:
        """Route nothing more to it (from every revision); False if it was not routed."""

    def in_flight(self, url: str) -> int:
        """The gateway's requests in flight on this replica."""

    def finished(self, url: str) -> int | None:
        """Requests the gateway finished on it (answered or failed); None if it does not know the URL."""

    def admission_load(self) -> AdmissionLoad:
        """Requests admitted and queued for this model (every replica, draining ones included)."""

    def has_live_upstream(self) -> bool:
        """Whether a request could be routed now."""

    def set_activator(self, hook: Callable[[], Awaitable[None]] | None) -> None:
        """`await hook()` runs for each admitted request before it is routed (scale from zero)."""

    def set_split(self, split: dict[str, float], stable: str) -> None:
        """Percent of requests per revision; `stable` is where a revision with no upstream left falls back."""

    def set_rollout(self, candidate: str | None, shadow_sample: float = 0.0,
                    shadow_feeds_analysis: bool = False) -> None:
        """A rollout of `candidate` begins (session pins, header selection, samples, its shadow) or ends (None)."""

    def window(self, t0: float, t1: float) -> dict[tuple[str, str], WindowStats]:
        """The requests that finished in [t0, t1) (monotonic), by (revision, "live" or "shadow")."""

    def agreement(self, revision: str, t0: float, t1: float) -> tuple[float | None, int]:
        """Identical share of greedy shadow pairs with this candidate in [t0, t1), and their count."""


class GatewayPort(Protocol):
    """The gateway the controller runs beside (one event loop)."""

    registry: CollectorRegistry  # the controller's series join the gateway's /metrics
    scraper: ReplicaScraper  # replicas' vllm:* gauges
    upstream_auth: UpstreamAuth  # the replicas' secret: in each replica's environment, on each call to it

    @property
    def session(self) -> aiohttp.ClientSession | None:
        """The pooled HTTP session (readiness probes); None before startup."""

    def model(self, name: str) -> ModelRoutes: ...

    def forget_upstream(self, url: str) -> None:
        """Drop a gone replica's state (breaker, counts, gauges)."""

    def attach_fleet(self, fleet: FleetView) -> None:
        """Serve the controller's view (GET /admin/fleet, the dashboard, /metrics/targets)."""


class ReplicaProvider(Protocol):
    """Where replicas run: subprocesses (local), Ray actors (ray), pods (kubernetes)."""

    name: str

    async def start(self, r: Replica) -> None:
        """Launch it and return once it listens (sets r.url, r.handle); raise if it cannot."""

    def alive(self, r: Replica) -> bool: ...

    async def wait(self, r: Replica) -> None:
        """Return when it has ended (r.detail says why). It may raise placement.OutOfMemoryAtLoad instead:
        the replica ran out of memory at load; the controller then grows the model's estimate."""

    async def stop(self, r: Replica, timeout: float = 10.0) -> None:
        """End it: gracefully, then by force after `timeout` seconds."""

    def kill_now(self, r: Replica) -> None:
        """Synchronous last resort at interpreter exit."""

    async def close(self) -> None: ...

    async def nodes(self) -> list[Node]:
        """The nodes it finds at run time (for a provider the fleet file lists none for)."""

    async def bind(self, listed: list[Node]) -> None:
        """Use the fleet file's nodes for this provider."""

    def down_nodes(self) -> set[str]:
        """Nodes not to place on now."""
