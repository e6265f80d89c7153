"""Who is who in a tensor x pipeline parallel engine, and the (optionally timed) communication ops.

Rank r is tensor-parallel rank r % T of pipeline stage r // T. Rank 0 is the driver: it runs the
scheduler and the KV cache manager and samples. Each stage's T ranks form one tensor-parallel group;
stage s's rank i sends its activations to stage s+1's rank i. Gloo on the CPU, NCCL on CUDA; the
ranks meet on 127.0.0.1 (local spawn), the driver's node IP (Ray) or MASTER_ADDR (torchrun).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

# A collective still waiting after this long fails instead of hanging. Only ranks inside one step wait
# on each other (an idle worker waits on its pipe, not in a collective), so this bounds one step.
COLLECTIVE_TIMEOUT = timedelta(seconds=300)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_device(base: torch.device, rank: int) -> torch.device:
    """Rank r uses the r-th GPU counted from the configured one; every rank shares the CPU."""
    if base.type == "cuda":
        return torch.device("cuda", (base.index or 0) + rank)
    return base


@dataclass
class ParallelState:
    rank: int
    tp_size: int
    pp_size: int
    device: torch.device
    tp_group: dist.ProcessGroup | None  # None when tp_size == 1
    # When set, the seconds spent in each kind of op accumulate in comm_seconds. On CUDA that
    # synchronizes around each op, so it is off unless a benchmark asks (ParallelExecutor.set_comm_timing).
    time_comm: bool = False
    comm_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def pp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def last_stage_root(self) -> int:
        """The rank that gathers the logits (tp rank 0 of the last stage)."""
        return (self.pp_size - 1) * self.tp_size

    # -- communication ------------------------------------------------------------------------------
    @contextmanager
    def _timed(self, kind: str):
        if not self.time_comm:
            yield
            return
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        yield
        sync()
        self.comm_seconds[kind] = self.comm_seconds.get(kind, 0.0) + time.perf_counter() - start

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sums x in place over this stage's tensor-parallel ranks."""
        if self.tp_group is not None:
            with self._timed("all_reduce"):
                dist.all_reduce(x, group=self.tp_group)
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor | None:
        """Concatenates x over the tensor-parallel ranks along the last dim, on tp rank 0 only."""
        if self.tp_group is None:
            return x
        root = self.pp_rank * self.tp_size
        parts = [torch.empty_like(x) for _ in range(self.tp_size)] if self.tp_rank == 0 else None
        with self._timed("gather"):
            dist.gather(x.contiguous(), parts, dst=root, group=self.tp_group)
        return torch.cat(parts, dim=-1) if parts is not None else None

    # Tags keep the micro-batches in flight apart (each step's messages carry its number); NCCL ignores
    # them and relies on the order, which is the same.
    def send(self, x: torch.Tensor, dst: int, tag: int = 0) -> None:
        with self._timed("send"):
            dist.send(x.contiguous(), dst, tag=tag)

    def recv(self, x: torch.Tensor, src: int, tag: int = 0) -> torch.Tensor:
        # On a later stage this includes the wait for the earlier stages' compute (the pipeline bubble).
        with self._timed("recv"):
            dist.recv(x, src, tag=tag)
        return x

    def isend(self, x: torch.Tensor, dst: int, tag: int = 0) -> dist.Work:
        """Starts a send; the caller keeps x alive and waits on the result (wait(work, "send"))."""
        return dist.isend(x, dst, tag=tag)

    def irecv(self, x: torch.Tensor, src: int, tag: int = 0) -> dist.Work:
        return dist.irecv(x, src, tag=tag)

    def wait(self, work: dist.Work, kind: str) -> None:
        with self._timed(kind):
            work.wait()

    def min_over_world(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def init_parallel(rank: int, tp_size: int, pp_size: int, device: torch.device, master_addr: str = "127.0.0.1",
                  port: int | None = None) -> ParallelState:
    """Joins the process group (every rank calls this) and builds the tensor-parallel groups. port None:
    the rendezvous comes from the environment (MASTER_ADDR / MASTER_PORT, as torchrun sets them)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif sys.platform == "linux" and is_loopback(master_addr):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one host: never pick an outside interface
    world = tp_size * pp_size
    init_method = "env://" if port is None else f"tcp://{master_addr}:{port}"
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=init_method,
                            rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    tp_group = None
    if tp_size > 1:
        # Every rank creates every group, in the same order (new_group is itself collective).
        for stage in range(pp_size):
            group = dist.new_group(list(range(stage * tp_size, (stage + 1) * tp_size)))
            if stage == rank // tp_size:
                tp_group = group
    return ParallelState(rank, tp_size, pp_size, device, tp_group)
