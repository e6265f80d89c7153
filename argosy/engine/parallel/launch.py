"""Where the other ranks come from: spawned here (`mp`, one host), Ray actors in a placement group
(`ray`, see ray_ranks.py) or the processes torchrun started (`torchrun`). The model code and each
rank's work are the same in all three; only the start, the rendezvous address, the control
connections and how a dead rank is noticed differ.

Every launcher is a `Ranks`: driver_device, master_addr, port (None: torchrun's env), connect(ps)
(after the driver joined the group: the control connections, rank order, in .conns), procs (the local
processes, if it spawned any), dead() (a description of a rank that has exited, or None) and
shutdown() (idempotent; holds no reference to the executor).
"""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Protocol

import torch
import torch.multiprocessing as mp

from argosy.engine.config import EngineConfig
from argosy.engine.parallel.control import STOP_TIMEOUT_S, accept_ranks, close_connections, ip_toward, send_stop
from argosy.engine.parallel.state import ParallelState, free_port, init_parallel, rank_device
from argosy.engine.parallel.worker import Worker, remote_worker_main, worker_main
from argosy.engine.platforms import platform_for

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    return all(v in os.environ for v in TORCHRUN_VARS) and int(os.environ["WORLD_SIZE"]) > 1


def resolve_backend(config: EngineConfig) -> str:
    """mp, ray or torchrun; unset means torchrun when started by it (RANK / WORLD_SIZE / MASTER_ADDR set)."""
    backend = config.distributed_executor_backend or ("torchrun" if under_torchrun() else "mp")
    if backend == "torchrun":
        world = config.tensor_parallel_size * config.pipeline_parallel_size
        if not under_torchrun() or int(os.environ["WORLD_SIZE"]) != world:
            raise ValueError(f"the torchrun backend needs torchrun's {world} processes (tensor_parallel_size x "
                             f"pipeline_parallel_size); WORLD_SIZE is {os.environ.get('WORLD_SIZE', 'not set')}: "
                             f"start it with torchrun --nproc-per-node={world} (or --nnodes x --nproc-per-node)")
    return backend


def run_if_worker_rank(config: EngineConfig) -> bool:
    """Under torchrun, on any rank but 0: serves the driver's steps until it stops, then returns True
    (the caller exits). Returns False on rank 0, and when not under torchrun."""
    if config.tensor_parallel_size * config.pipeline_parallel_size == 1 or resolve_backend(config) != "torchrun":
        return False
    rank = int(os.environ["RANK"])
    if rank == 0:
        return False
    remote_worker_main(rank, config, torchrun_device(config), os.environ["MASTER_ADDR"], None)
    return True


def torchrun_device(config: EngineConfig) -> torch.device:
    base = config.resolved_device()
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if base.type == "cuda" else base


class Ranks(Protocol):
    """How the other ranks were started (SpawnedRanks, TorchrunRanks, ray_ranks.RayRanks)."""

    driver_device: torch.device
    master_addr: str
    port: int | None  # None: torchrun's environment
    conns: list[Connection]  # control connections to ranks 1..N-1, in rank order (after connect)
    procs: list[BaseProcess]  # the local processes (spawned here); empty for the others

    def connect(self, ps: ParallelState) -> None: ...

    def dead(self) -> str | None: ...

    def shutdown(self) -> None: ...


class SpawnedRanks:
    """mp: ranks 1..N-1 as local processes (torch.multiprocessing, spawn), one pipe each; meet on 127.0.0.1."""

    def __init__(self, config: EngineConfig):
        tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
        base = config.resolved_device()
        if base.type == "cuda" and (base.index or 0) + tp * pp > torch.cuda.device_count():
            raise ValueError(f"tensor_parallel_size x pipeline_parallel_size = {tp * pp} needs that many GPUs "
                             f"from {base}; {torch.cuda.device_count()} are visible")
        self.driver_device, self.master_addr, self.port = rank_device(base, 0), "127.0.0.1", free_port()
        self.procs: list[BaseProcess] = []
        self.conns: list[Connection] = []
        ctx = mp.get_context("spawn")
        for rank in range(1, tp * pp):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(rank, self.port, config, child), name=f"argosy-rank-{rank}",
                            daemon=True)
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)

    def connect(self, ps: ParallelState) -> None:
        pass  # the pipes exist from the start

    def dead(self) -> str | None:
        for rank, p in enumerate(self.procs, start=1):
            if p.exitcode is not None:
                return f"worker {rank} exited with code {p.exitcode}"
        return None

    def shutdown(self) -> None:
        """Asks every worker to stop, then kills the ones that do not. Also runs at interpreter exit."""
        send_stop(self.conns)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(1.0)
        close_connections(self.conns, [])


class TorchrunRanks:
    """torchrun: this process is rank 0; the others run run_if_worker_rank. torchrun owns their
    lives: when one fails its agent stops the rest, and a collective waiting on it fails here."""

    def __init__(self, config: EngineConfig):
        if int(os.environ["RANK"]) != 0:
            raise RuntimeError("only torchrun's rank 0 runs the engine; call run_if_worker_rank(config) first")
        self.driver_device = torchrun_device(config)
        self.master_addr, self.port = os.environ["MASTER_ADDR"], None
        self.conns: list[Connection] = []
        self.procs: list[BaseProcess] = []  # torchrun's, not ours
        self.listeners: list = []

    def connect(self, ps: ParallelState) -> None:
        self.conns.extend(accept_ranks(ps, ip_toward(self.master_addr, int(os.environ["MASTER_PORT"])),
                                       self.listeners))

    def dead(self) -> str | None:
        return None

    def shutdown(self) -> None:
        send_stop(self.conns)
        close_connections(self.conns, self.listeners)


def start_ranks(config: EngineConfig) -> Ranks:
    backend = resolve_backend(config)
    if backend == "ray":
        from argosy.engine.parallel.ray_ranks import RayRanks

        return RayRanks(config)
    return TorchrunRanks(config) if backend == "torchrun" else SpawnedRanks(config)


def driver_worker(config: EngineConfig, ranks: Ranks) -> Worker:
    """Rank 0's start-up: joins the group, connects the other ranks, loads its shard."""
    ps = init_parallel(0, config.tensor_parallel_size, config.pipeline_parallel_size, ranks.driver_device,
                       ranks.master_addr, ranks.port)
    ranks.connect(ps)
    local = config.tensor_parallel_size * config.pipeline_parallel_size if isinstance(ranks, SpawnedRanks) else 1
    platform_for(ranks.driver_device).use_threads(config.cpu_threads, local)  # spawned ranks share this host
    return Worker(config, ps)
