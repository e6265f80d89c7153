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

from argosy.config import FleetConfig, FleetConfigError, ModelConfig, ResolvedRevision, load_fleet
from argosy.engine.host_cores import usable_cores
from argosy.fleet.capacity import CapacityBook, summary
from argosy.fleet.local import LocalProvider, cpu_threads_each
from argosy.fleet.metrics import FleetMetrics
from argosy.fleet.model_controller import ModelController
from argosy.fleet.placement import Need, Node, Placer, detect_nodes, replica_need, runs_on_gpu
from argosy.fleet.preemption import PreemptionNotice, Preemptions
from argosy.fleet.replica import DRAINING, READY, WARMING
from argosy.fleet.rollout.manager import RolloutManager
from argosy.fleet.rollout.metrics import RolloutMetrics
from argosy.fleet.rollout.store import default_state_path, make_store
from argosy.fleet.seams import GatewayPort, ReplicaProvider
from argosy.gateway.errors import GatewayError, bad_request, not_found

PROVIDERS = ("local", "ray", "kubernetes")
DISCOVERS_NODES = {"ray", "kubernetes"}  # providers whose nodes, when the fleet file lists none, are found at run time

log = logging.getLogger("argosy.fleet")


def make_provider(name: str, options: dict) -> ReplicaProvider:
    if name == "local":
        return LocalProvider(options)
    if name == "ray":
        from argosy.fleet.ray_provider import RayProvider

        return RayProvider(options)
    if name == "kubernetes":
        from argosy.fleet.kubernetes_provider import KubernetesProvider

        return KubernetesProvider(options)
    raise ValueError(f"providers.{name}: unknown provider ({', '.join(PROVIDERS)})")


def managed(fleet: FleetConfig) -> list[ModelConfig]:
    """Models the controller starts replicas for: a checkpoint (or revisions) and no fixed upstreams."""
    return [m for m in fleet.models if (m.checkpoint or m.revisions) and m.upstreams is None and not m.traffic]


def routed_only(fleet: FleetConfig) -> list[str]:
    """One line for each model the file gives a checkpoint that Argosy will not run, because `traffic` makes it a
    routed model (the fleet example's shape): `argosy serve` started no replica of it and said nothing, and
    every request was a 503 "no live upstream"."""
    return [f"models.{m.name}: has a checkpoint, but `traffic` makes it a model Argosy only routes to: no replica "
            f"of it is started, and its revisions ({', '.join(t.revision for t in m.traffic)}) have no upstream "
            "until one is added (/admin/upstreams). For Argosy to run it, list its `revisions:` instead of "
            "`traffic` and move traffic between them with a rollout (docs/rollouts.md)"
            for m in fleet.models if m.checkpoint and m.traffic and m.upstreams is None and m.discover is None]


def model_resources(m: ModelConfig) -> dict[str, float]:
    """`models[].resources`: custom resources (Ray's) each replica of the model asks for."""
    return dict(m.resources)


def revision_need(m: ModelConfig, rev: ResolvedRevision, nodes: list[Node]) -> Need:
    """One replica of this revision: from its checkpoint's config.json and engine settings."""
    on_gpu = runs_on_gpu(rev.engine, any(n.gpus for n in nodes if n.provider == m.provider))
    if m.kind != "generate":  # an encoder: weights and a batch's activations, a share of a GPU
        from argosy.fleet.components import encoder_need

        need = encoder_need(rev.checkpoint, rev.engine, on_gpu)
    else:
        need = replica_need(rev.checkpoint, rev.engine, on_gpu)
    return Need.of(need.gpus, need.gib, model_resources(m))


def model_need(m: ModelConfig, nodes: list[Node]) -> Need:
    """One replica of the model's stable revision (as the fleet file starts it)."""
    return revision_need(m, m.resolved()[m.stable_at_start()], nodes)


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
    def __init__(self, fleet: FleetConfig, gateway: GatewayPort, source: str | None = None):
        self.fleet, self.gateway = fleet, gateway
        self.source = source  # the fleet file: `rollout start` reads new revisions from it
        self.metrics = FleetMetrics(gateway.registry)
        self.providers: dict[str, ReplicaProvider] = {}
        self.models: dict[str, ModelController] = {}
        self.rollouts: dict[str, RolloutManager] = {}
        self.rollout_metrics = RolloutMetrics(gateway.registry, lambda: self.rollouts.values())
        self.store = make_store(fleet.gateway.redis_url, fleet.state_file or default_state_path(source))
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
        threads = cpu_threads_each(models, any(n.gpus for n in nodes if n.provider == "local"))
        if threads is not None:
            log.info("fleet: CPU replicas on this machine run their kernels on %d thread%s each (its %d cores "
                     "over the replicas the fleet file allows here; engine.cpu_threads sets it)", threads,
                     "" if threads == 1 else "s", usable_cores())
        for m in models:
            routes = self.gateway.model(m.name)
            mc = ModelController(m, routes, self.gateway, self.providers[m.provider], self.placer,
                                 lambda rev, m=m: revision_need(m, rev, nodes), self.metrics,
                                 otlp_endpoint=self.fleet.gateway.otlp_endpoint,
                                 cpu_threads=threads if m.provider == "local" else None)
            self.models[m.name] = mc
            self.rollouts[m.name] = mgr = RolloutManager(mc, routes, self.store, self.rollout_metrics, m.rollout)
            await mgr.restore()  # the stable revision and split it had; a rollout in progress resumes
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
        await asyncio.gather(*(mgr.stop() for mgr in self.rollouts.values()), return_exceptions=True)
        await asyncio.gather(*(mc.stop() for mc in self.models.values()), return_exceptions=True)
        await self.store.close()
        for p in self.providers.values():
            await p.close()

    def kill_now(self) -> None:
        for mc in self.models.values():
            for r in list(mc.replicas.values()):
                mc.provider.kill_now(r)

    # ------------------------------------------------------------------ rollouts (the gateway's admin API)

    def rollout_status(self, model: str | None = None) -> list[dict]:
        if model is not None and model not in self.rollouts:
            raise not_found(f"no managed model {model!r} (managed: {', '.join(self.rollouts) or 'none'})")
        return [mgr.status() for name, mgr in self.rollouts.items() if model is None or name == model]

    async def rollout_command(self, model: str, verb: str, body: dict) -> dict:
        mgr = self.rollouts.get(model)
        if mgr is None:
            raise not_found(f"no managed model {model!r} (managed: {', '.join(self.rollouts) or 'none'})")
        if verb == "start":
            to, strategy = body.get("to"), body.get("strategy")
            if not isinstance(to, str) or not to or (strategy is not None and not isinstance(strategy, str)):
                raise bad_request("give the revision to roll out to: {\"to\": REVISION[, \"strategy\": "
                                  "canary|blue-green|rolling]}", "to")
            return await mgr.start(to, strategy, self.reload_revisions(model))
        if verb == "promote":
            return await mgr.promote(bool(body.get("full")))
        if verb in ("pause", "resume"):
            return await mgr.pause(verb == "pause")
        if verb == "abort":
            reason = body.get("reason")
            return await mgr.abort(reason if isinstance(reason, str) and reason else "aborted by an operator")
        raise not_found(f"no rollout command {verb!r} (start, promote, pause, resume, abort)")

    def reload_revisions(self, model: str):
        """The model's revisions and rollout section as the fleet file has them now (new revisions are
        added by editing the file; nothing else in it is reloaded). Running revisions keep their settings."""
        mc = self.models[model]
        if self.source is None:
            return None
        try:
            fleet = load_fleet(self.source)
        except FleetConfigError as e:
            raise GatewayError(400, f"the fleet file does not load: {e}", "invalid_request_error",
                               "invalid_fleet_file") from None
        m = next((x for x in fleet.models if x.name == model), None)
        if m is None:
            raise bad_request(f"model {model!r} is no longer in {self.source}", "model")
        running = {r.revision for r in mc.replicas.values()} | set(mc.plans)
        new = m.resolved()
        for rev, rc in new.items():
            if rev not in running and mc.revisions.get(rev) != rc:
                mc.revisions[rev] = rc
                mc.needs.pop(rev, None)
                log.info("fleet: %s: revision %s from %s (checkpoint %s)", model, rev, self.source, rc.checkpoint)
        return m.rollout

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
        models = []
        for name, mc in self.models.items():
            st = mc.status()
            st["rollout"] = self.rollouts[name].status()["rollout"] if name in self.rollouts else None
            models.append(st)
        out = {"nodes": nodes, "models": models}
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
