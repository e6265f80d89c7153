"""The fleet controller: one ModelController per managed model, the providers and the shared placer.

It runs in the gateway's event loop (`argosy serve`): replicas join and leave the gateway's routing
sets in-process, and the gateway's activator hook holds requests for a model scaled to zero. It reaches
the gateway and the providers only through argosy.fleet.seams; the gateway reads it back as a FleetView
(status, decisions, scrape targets).
"""

from __future__ import annotations

import asyncio
import atexit
import logging

from argosy.config import FleetConfig, ModelConfig
from argosy.fleet.capacity import CapacityBook, summary
from argosy.fleet.local import LocalProvider
from argosy.fleet.metrics import FleetMetrics
from argosy.fleet.model_controller import ModelController
from argosy.fleet.placement import Need, Node, Placer, detect_nodes, replica_need
from argosy.fleet.preemption import PreemptionNotice, Preemptions
from argosy.fleet.replica import DRAINING, READY, WARMING
from argosy.fleet.seams import GatewayPort, ReplicaProvider

PROVIDERS = ("local", "ray")
DISCOVERS_NODES = {"ray"}  # providers whose nodes, when the fleet file lists none, are found at run time

log = logging.getLogger("argosy.fleet")


def make_provider(name: str, options: dict) -> ReplicaProvider:
    if name == "local":
        return LocalProvider(options)
    if name == "ray":
        from argosy.fleet.ray_provider import RayProvider

        return RayProvider(options)
    raise ValueError(f"providers.{name}: unknown provider ({', '.join(PROVIDERS)})")


def managed(fleet: FleetConfig) -> list[ModelConfig]:
    """Models the controller starts replicas for: a checkpoint and no fixed upstreams."""
    return [m for m in fleet.models if m.checkpoint and m.upstreams is None and not m.traffic]


def model_resources(m: ModelConfig) -> dict[str, float]:
    """`models[].resources`: custom resources (Ray's) each replica of the model asks for."""
    return dict(m.resources)


def model_need(m: ModelConfig, nodes: list[Node]) -> Need:
    gpus_here = any(n.gpus for n in nodes if n.provider == m.provider)
    on_gpu = m.engine.device.startswith("cuda") or (m.engine.device == "auto" and gpus_here)
    need = replica_need(m.checkpoint, m.engine, on_gpu)
    return Need.of(need.gpus, need.gib, model_resources(m))


def known_nodes(fleet: FleetConfig, providers: list[str]) -> tuple[list[Node], list[str]]:
    """Nodes known without contacting a provider, and the providers that find theirs at run time.

    Every node the fleet file lists; for a provider with none listed: `local`, this machine; `ray`,
    nothing here (its live nodes are discovered when it connects).
    """
    listed = detect_nodes(fleet.nodes) if fleet.nodes else []
    nodes, later = list(listed), []
    for name in providers:
        if any(n.provider == name for n in listed):
            continue
        if name in DISCOVERS_NODES:
            later.append(name)
        else:
            nodes += detect_nodes(None)
    return nodes, later


class Controller:
    def __init__(self, fleet: FleetConfig, gateway: GatewayPort):
        self.fleet, self.gateway = fleet, gateway
        self.metrics = FleetMetrics(gateway.registry)
        self.providers: dict[str, ReplicaProvider] = {}
        self.models: dict[str, ModelController] = {}
        self.placer: Placer | None = None
        self.capacity = CapacityBook.of(fleet)  # this region's capacity kinds (docs/regions.md)
        self.preemptions = Preemptions(self)

    async def start(self) -> None:
        models = managed(self.fleet)
        for m in models:
            if m.provider not in self.providers:
                self.providers[m.provider] = make_provider(m.provider, self.fleet.providers.get(m.provider, {}))
        nodes = await self._nodes()
        self.placer = Placer(nodes, self.capacity)
        for n in nodes:
            gpus = ", ".join(f"{g.model} {g.memory_gib:.0f} GiB" for g in n.gpus) or "no GPUs"
            ram = "unbounded" if n.memory_gib == float("inf") else f"{n.memory_gib:.1f} GiB"
            log.info("fleet: node %s (%s): %s, RAM %s", n.name, n.provider, gpus, ram)
        for m in models:
            mc = ModelController(m, self.gateway.model(m.name), self.gateway, self.providers[m.provider], self.placer,
                                 model_need(m, nodes), self.metrics, otlp_endpoint=self.fleet.gateway.otlp_endpoint)
            self.models[m.name] = mc
            mc.start()
        self.preemptions.start(self.providers)  # providers that hear of preemptions themselves
        atexit.register(self.kill_now)  # backstop if the loop never reaches stop()

    async def _nodes(self) -> list[Node]:
        """The fleet file's nodes (a provider that can binds its own to its live nodes) and, for a
        provider with none listed, this machine (local) or the nodes it discovers (ray)."""
        nodes, later = known_nodes(self.fleet, list(self.providers))
        for name, p in self.providers.items():
            if name in later:
                found = await p.nodes()
                for n in found:
                    n.provider = name
                nodes += found
            else:
                await p.bind([n for n in nodes if n.provider == name])
        return nodes or detect_nodes(None)

    async def stop(self) -> None:
        await self.preemptions.stop()
        await asyncio.gather(*(mc.stop() for mc in self.models.values()), return_exceptions=True)
        for p in self.providers.values():
            await p.close()

    def kill_now(self) -> None:
        for mc in self.models.values():
            for r in list(mc.replicas.values()):
                mc.provider.kill_now(r)

    def status(self) -> dict:
        nodes = []
        for n in (self.placer.nodes.values() if self.placer else []):
            nodes.append({"name": n.name, "provider": n.provider,
                          "gpus": [{"index": g.index, "model": g.model, "memory_gib": g.memory_gib,
                                    "used_gib": round(g.used_gib, 3)} for g in n.gpus],
                          "memory_gib": None if n.memory_gib == float("inf") else round(n.memory_gib, 2),
                          "used_gib": round(n.used_gib, 3),
                          "resources": {k: {"total": v, "used": round(n.used_resources.get(k, 0.0), 6)}
                                        for k, v in n.resources.items()}})
        out = {"nodes": nodes, "models": [mc.status() for mc in self.models.values()]}
        if self.capacity is not None:  # replicas by region, provider and capacity kind, with their $/h
            for n in nodes:
                n["capacity_kind"] = self.capacity.kind(n["name"])
                n["preempted"] = n["name"] in self.preemptions.notices
            for m in out["models"]:
                for r in m["replicas"]:
                    r.update(self.capacity.describe(r))
            out["capacity"] = summary([r for m in out["models"] for r in m["replicas"]])
            out["capacity"]["preemptions"] = list(self.preemptions.notices.values())
        return out

    # ------------------------------------------------------------------ capacity kinds (docs/regions.md)

    def preempt(self, node: str, deadline_s: float, source: str = "admin", restore: bool = False) -> dict:
        """A preemption notice for a node (or its return): raises KeyError for an unknown node."""
        return self.preemptions.apply(PreemptionNotice(node, deadline_s, source, restore))

    def replica_price(self, model: str) -> float | None:
        """The mean $/h of the model's ready replicas here (what a region's state tells the others)."""
        mc = self.models.get(model)
        if mc is None or self.capacity is None:
            return None
        prices = [self.capacity.usd_per_hour(r.node, len(r.spec.placement.gpus) if r.spec.placement else 0)
                  for r in mc.ready_routed()]
        prices = [p for p in prices if p is not None]
        return sum(prices) / len(prices) if prices else None

    # ------------------------------------------------------------------ the gateway's FleetView

    def decisions(self) -> list[dict]:
        """The autoscalers' recent decisions that changed something (up to 20 per model)."""
        return [d for mc in self.models.values() for d in list(mc.decisions)]

    def targets(self) -> list[dict]:
        """Every replica that listens (warming, ready, draining; warm pool too): url, model, replica, state."""
        return [{"url": r.url, "model": name, "replica": r.id, "state": r.state, "pooled": r.pooled}
                for name, mc in self.models.items() for r in list(mc.replicas.values())
                if r.url and r.state in (WARMING, READY, DRAINING)]
