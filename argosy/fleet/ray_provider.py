"""The Ray provider: each replica is a Ray actor that runs `argosy engine` as a subprocess on its node.

The placer picks the node; the actor is pinned there (strict NodeAffinitySchedulingStrategy) and asks
Ray for the replica's GPUs (`num_gpus`: Ray sets CUDA_VISIBLE_DEVICES), `num_cpus` and its model's
custom `resources`. Nodes are the cluster's live ones (`ray-<node id>`), or, when the fleet file lists
nodes for this provider, those, each bound to the one live Ray node that its name names (see
`match_node`); a listed node with no such Ray node counts as down, and is bound again when one joins.
The engine child dies with its actor (PR_SET_PDEATHSIG), so a lost node, a killed actor or the end of
`argosy serve` (the actors are not detached) leaves nothing running. Set RAY_AUTH_MODE /
RAY_USAGE_STATS_ENABLED as the cluster needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time

from argosy.config_providers import RayProviderOptions
from argosy.fleet.placement import GPU, Node, Placement
from argosy.fleet.replica import Replica

GIB = 1024 ** 3
STANDARD_RESOURCES = {"CPU", "GPU", "memory", "object_store_memory"}  # the rest are custom resources

log = logging.getLogger("argosy.fleet")


def custom_resources(resources: dict[str, float]) -> dict[str, float]:
    """A Ray node's resources other than CPU, GPU and memory (`node:<ip>`, `accelerator_type:*` included)."""
    return {k: v for k, v in resources.items() if k not in STANDARD_RESOURCES}


def match_node(node: Node, ray_nodes: list[dict]) -> tuple[str | None, str]:
    """(Ray node ID, "") of the one live Ray node a fleet-file node stands for, or (None, why not).

    A Ray node matches when the name is its node name (`ray start --node-name`), IP or hostname, or one
    of its resources (`ray start --resources '{"NAME": 1}'`, or `node:NAME`), and it offers at least
    the fleet file's `resources` for the node. Two matches are ambiguous: neither is used.
    """
    name = node.name
    hits = [r for r in ray_nodes if r.get("Alive") and (
        name in (r.get("NodeName"), r.get("NodeManagerAddress"), r.get("NodeManagerHostname"))
        or name in r.get("Resources", {}) or f"node:{name}" in r.get("Resources", {}))]
    if not hits:
        return None, f"node {name}: no live Ray node has this name, IP, hostname or resource"
    if len(hits) > 1:
        return None, f"node {name}: {len(hits)} live Ray nodes match it (ambiguous); give one a unique resource"
    res = hits[0].get("Resources", {})
    lacking = {k: v for k, v in node.resources.items() if res.get(k, 0.0) < v - 1e-9}
    if lacking:
        return None, f"node {name}: its Ray node offers less than the fleet file's resources {lacking}"
    return hits[0]["NodeID"], ""


def actor_options(p: Placement | None, num_cpus: float, node_id: str | None) -> dict:
    """Ray actor options for one replica: CPUs, its GPUs, its model's custom resources, its node."""
    opts: dict = {"num_cpus": num_cpus, "num_gpus": len(p.gpus) if p else 0, "max_concurrency": 4}
    if p is not None and p.need.resources:
        opts["resources"] = dict(p.need.resources)
    if node_id is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return opts


class EngineActor:
    """Lives in a Ray worker on the replica's node; threaded (max_concurrency) so wait() and stop() overlap."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def start(self, spec_cmd: list[str], env: dict[str, str], timeout: float = 600.0) -> str:
        import ray

        from argosy.fleet.local import die_with_parent

        ip = ray.util.get_node_ip_address()
        cmd = [sys.executable if a == "{python}" else ip if a == "{host}" else a for a in spec_cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **env}, start_new_session=True, preexec_fn=die_with_parent)
        deadline, tail = time.monotonic() + timeout, []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"exited ({self.proc.wait()}) before listening: {' | '.join(tail[-5:])}")
            tail.append(line.strip())
            if "listening on " in line:
                # Keep reading so a full pipe never blocks the engine.
                import threading

                threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
                return line.split("listening on ", 1)[1].split(",", 1)[0].strip()
        raise RuntimeError("did not listen in time")

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def wait(self) -> int:
        return self.proc.wait() if self.proc else 0

    def stop(self, timeout: float) -> None:
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class RayProvider:
    """A ReplicaProvider (argosy.fleet.seams) on a Ray cluster."""

    name = "ray"

    def __init__(self, options: dict | None = None):
        self.opts = RayProviderOptions.model_validate(options or {})
        self.node_ids: dict[str, str] = {}  # placer node name -> Ray node id (discovered, or a bound listed one)
        self.listed: dict[str, Node] = {}  # fleet-file nodes of this provider, bound by name to Ray nodes
        self.unbound: dict[str, str] = {}  # listed node name -> why no live Ray node stands for it
        self.dead: set[str] = set()  # replica ids whose actor or engine ended

    def _ray(self):
        import ray

        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(address=self.opts.address, namespace=self.opts.namespace, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        return ray

    async def nodes(self) -> list[Node]:
        """The cluster's live nodes: GPUs (memory unknown to Ray: whole GPUs), memory, custom resources."""
        ray = await asyncio.to_thread(self._ray)  # connecting can take seconds: not on the gateway's loop
        out = []
        for n in ray.nodes():
            if not n["Alive"]:
                continue
            res = n["Resources"]
            name = "ray-" + n["NodeID"][:8]
            self.node_ids[name] = n["NodeID"]
            per_gpu = res.get("gpu_memory_gib", 1e6)  # a node may advertise it as a custom resource
            gpus = [GPU(i, res.get("accelerator_type", "GPU"), per_gpu) for i in range(int(res.get("GPU", 0)))]
            out.append(Node(name, "ray", gpus, res.get("memory", float("inf")) / GIB,
                            resources=custom_resources(res)))
        return out

    async def bind(self, listed: list[Node]) -> None:
        """Use the fleet file's nodes for this provider: bind each to its live Ray node (`match_node`)."""
        ray = await asyncio.to_thread(self._ray)
        self.listed = {n.name: n for n in listed}
        self._resolve(await asyncio.to_thread(ray.nodes))

    def _resolve(self, table: list[dict]) -> None:
        for name, node in self.listed.items():
            nid, why = match_node(node, table)
            if nid is None:
                if self.unbound.get(name) != why:
                    log.warning("fleet: ray: %s; no replica is placed there", why)
                self.unbound[name] = why
                self.node_ids.pop(name, None)
            else:
                if self.node_ids.get(name) != nid:
                    log.info("fleet: ray: node %s is Ray node %s", name, nid)
                self.unbound.pop(name, None)
                self.node_ids[name] = nid

    def down_nodes(self) -> set[str]:
        """Nodes not to place on: discovered ones Ray reports dead, listed ones with no live Ray node."""
        table = self._ray().nodes()
        self._resolve(table)
        alive = {n["NodeID"] for n in table if n["Alive"]}
        return set(self.unbound) | {name for name, nid in self.node_ids.items() if nid not in alive}

    async def start(self, r: Replica) -> None:
        ray = self._ray()
        from argosy.fleet.local import engine_command

        p = r.spec.placement
        if p is not None and p.node not in self.node_ids:
            raise RuntimeError(self.unbound.get(p.node, f"node {p.node}: not a Ray node"))
        opts = actor_options(p, self.opts.num_cpus, self.node_ids[p.node] if p is not None else None)
        cmd = engine_command(r.spec, "{python}", "{host}")
        actor = ray.remote(EngineActor).options(**opts).remote()
        r.handle = actor
        r.url = await actor.start.remote(cmd, r.spec.env)
        r.log_task = asyncio.get_running_loop().create_task(self._watch(r))

    async def _watch(self, r: Replica) -> None:
        try:
            await r.handle.wait.remote()
        except Exception as e:  # the actor died with its node: RayActorError and kin
            r.detail = f"actor lost: {type(e).__name__}"
        self.dead.add(r.id)

    async def wait(self, r: Replica) -> None:
        await asyncio.shield(r.log_task)

    def alive(self, r: Replica) -> bool:
        return r.handle is not None and r.id not in self.dead

    async def stop(self, r: Replica, timeout: float = 10.0) -> None:
        if r.handle is None:
            return
        ray = self._ray()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(r.handle.stop.remote(timeout), timeout + 5)
        with contextlib.suppress(Exception):
            ray.kill(r.handle)
        if r.log_task is not None:
            r.log_task.cancel()

    def kill_now(self, r: Replica) -> None:
        """Synchronous last resort (interpreter exit): kill the actor; its engine child dies with it."""
        import ray

        if r.handle is not None and ray.is_initialized():
            with contextlib.suppress(Exception):
                ray.kill(r.handle)

    async def close(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
