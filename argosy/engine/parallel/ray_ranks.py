"""The ray backend: one bundle per rank in a placement group ({"GPU": 1} on CUDA, {"CPU": 1} on the
CPU), one actor per bundle. Bundle 0 is pinned to the driver's node (Ray's `node:<ip>` resource): rank
0 runs in the calling process, and that bundle's actor only holds the slot (and, on CUDA, says which
GPU Ray set aside for the driver). Ranks 1..N-1 run the same worker code as a local spawn, and meet
on the driver's node IP.

Uses the Ray cluster this process is connected to (ray.init(address=...) before, or RAY_ADDRESS); with
neither, ray.init() starts a local one.
"""

from __future__ import annotations

from multiprocessing.connection import Connection

import torch

from argosy.engine.config import EngineConfig
from argosy.engine.parallel.control import STOP_TIMEOUT_S, accept_ranks, close_connections, send_stop
from argosy.engine.parallel.state import ParallelState, free_port
from argosy.engine.parallel.worker import remote_worker_main

PLACEMENT_TIMEOUT_S = 60.0


class RankActor:
    """One bundle's actor. Its run() lasts as long as the rank: Ray resolves it when the rank ends."""

    def gpu_ids(self) -> list[int]:
        import ray

        return [int(i) for i in ray.get_gpu_ids()]

    def run(self, rank: int, config: EngineConfig, device_type: str, master_addr: str, port: int) -> None:
        # Ray makes only this actor's GPU visible: it is cuda:0 here.
        device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
        remote_worker_main(rank, config, device, master_addr, port)


class RayRanks:
    def __init__(self, config: EngineConfig):
        try:
            import ray
            from ray.util.placement_group import placement_group, remove_placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        except ImportError as e:
            raise RuntimeError("distributed_executor_backend='ray' needs Ray: pip install 'ray[default]'") from e
        self.ray, self._remove_pg = ray, remove_placement_group
        if not ray.is_initialized():
            ray.init()
        world = config.tensor_parallel_size * config.pipeline_parallel_size
        device_type = config.resolved_device().type
        unit = {"GPU": 1.0} if device_type == "cuda" else {"CPU": 1.0}
        # The address Ray knows this node by (as `node:<ip>`), which may differ from the routed one.
        node_id = ray.get_runtime_context().get_node_id()
        self.master_addr = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)
        bundles = [{**unit, f"node:{self.master_addr}": 0.001}] + [dict(unit) for _ in range(world - 1)]
        self.pg = placement_group(bundles, strategy="PACK")
        self.actors, self.refs = [], []
        self.conns: list[Connection] = []
        self.procs: list = []  # the ranks are Ray's actors, not processes of ours
        self.listeners: list = []
        ready, _ = ray.wait([self.pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            self.shutdown()
            raise RuntimeError(f"the Ray cluster did not fit {world} bundles of {unit} (one on this node, "
                               f"{self.master_addr}) within {PLACEMENT_TIMEOUT_S:.0f} s; `ray status` shows "
                               "what is free")
        try:
            actor_cls = ray.remote(RankActor)
            for bundle in range(world):
                strategy = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=bundle)
                self.actors.append(actor_cls.options(num_cpus=unit.get("CPU", 0), num_gpus=unit.get("GPU", 0),
                                                     scheduling_strategy=strategy).remote())
            self.driver_device = torch.device("cpu")
            if device_type == "cuda":  # the GPU Ray set aside in bundle 0 (this process sees the node's GPUs)
                self.driver_device = torch.device("cuda", ray.get(self.actors[0].gpu_ids.remote())[0])
            self.port = free_port(self.master_addr)
            self.refs = [a.run.remote(rank, config, device_type, self.master_addr, self.port)
                         for rank, a in enumerate(self.actors) if rank > 0]
        except BaseException:
            self.shutdown()  # the executor's finalizer does not exist yet: give the bundles back here
            raise

    def connect(self, ps: ParallelState) -> None:
        self.conns.extend(accept_ranks(ps, self.master_addr, self.listeners))

    def dead(self) -> str | None:
        if not self.refs:
            return None
        try:
            ready, _ = self.ray.wait(self.refs, num_returns=1, timeout=0)
        except Exception:  # noqa: BLE001 - Ray shut down (interpreter exit) before the engine
            return None
        if not ready:
            return None
        rank = self.refs.index(ready[0]) + 1
        try:
            self.ray.get(ready[0])
            return f"worker {rank} (Ray actor) exited"
        except Exception as e:  # noqa: BLE001 - the actor's death, described
            return f"worker {rank} (Ray actor) failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"

    def shutdown(self) -> None:
        send_stop(self.conns)
        ray = self.ray
        try:
            if self.refs:
                ray.wait(self.refs, num_returns=len(self.refs), timeout=STOP_TIMEOUT_S)
            for a in self.actors:
                ray.kill(a)
            self._remove_pg(self.pg)
        except Exception:  # noqa: BLE001 - Ray already shut down (interpreter exit): its actors went with it
            pass
        self.refs, self.actors = [], []
        close_connections(self.conns, self.listeners)
