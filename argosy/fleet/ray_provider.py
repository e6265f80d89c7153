"""The Ray provider: each replica is a Ray actor that runs `argosy engine` as a subprocess on its node.

The placer picks the node; the actor is pinned there (NodeAffinitySchedulingStrategy for nodes found
in the cluster, or the node's custom `resources` from the fleet file) and asks Ray for the replica's
GPUs (`num_gpus`: Ray sets CUDA_VISIBLE_DEVICES). The engine child dies with its actor
(PR_SET_PDEATHSIG), so a lost node, a killed actor or the end of `argosy serve` (the actors are not
detached) leaves nothing running. Set RAY_AUTH_MODE / RAY_USAGE_STATS_ENABLED as the cluster needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

from argosy.config import RayProviderOptions
from argosy.fleet.placement import GPU, Node
from argosy.fleet.replica import Replica

GIB = 1024 ** 3


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
    name = "ray"

    def __init__(self, options: dict | None = None):
        self.opts = RayProviderOptions.model_validate(options or {})
        self.node_ids: dict[str, str] = {}  # placer node name -> Ray node id
        self.dead: set[str] = set()  # replica ids whose actor or engine ended

    def _ray(self):
        import ray

        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(address=self.opts.address, namespace=self.opts.namespace, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        return ray

    async def nodes(self) -> list[Node]:
        """The cluster's live nodes: GPUs (memory unknown to Ray: whole GPUs) and memory for actors."""
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
            out.append(Node(name, "ray", gpus, res.get("memory", float("inf")) / GIB))
        return out

    def down_nodes(self) -> set[str]:
        ray = self._ray()
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        return {name for name, nid in self.node_ids.items() if nid not in alive}

    async def start(self, r: Replica) -> None:
        ray = self._ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from argosy.fleet.local import engine_command

        p = r.spec.placement
        opts: dict = {"num_cpus": self.opts.num_cpus, "num_gpus": len(p.gpus) if p else 0, "max_concurrency": 4}
        if p is not None and p.node in self.node_ids:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self.node_ids[p.node], soft=False)
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

    async def close(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
