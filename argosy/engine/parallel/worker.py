"""One rank: its model shard, its KV cache (its layers, its KV heads), and its part of each step.

The driver (rank 0) holds a Worker too, and also prepares the batch (`RunnerBase.prepare`). Other
ranks run `serve_steps`: they wait on a connection to the driver (a pipe when spawned locally, TCP
under Ray or torchrun) for its next step, so an idle engine has no collective waiting to time out,
and a driver that dies closes the connection and so ends them. Each rank runs the steps in order, so
micro-batches in flight reach every stage in the order the driver started them.
"""

from __future__ import annotations

import dataclasses
import pickle
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from argosy.engine.batch import BatchInputs
from argosy.engine.checkpoint import load_model_config
from argosy.engine.config import EngineConfig
from argosy.engine.model_runner import RunnerBase
from argosy.engine.models.llama import rope_inv_freq
from argosy.engine.models.skeleton import materialize
from argosy.engine.parallel.control import connect_to_driver
from argosy.engine.parallel.model import ShardedLlama, load_shard, local_config
from argosy.engine.parallel.state import ParallelState, init_parallel, rank_device
from argosy.engine.platforms import platform_for
from argosy.engine.platforms.base import resolve_dtype


def map_tensors(obj, fn: Callable[[torch.Tensor], torch.Tensor]):
    """Applies fn to every tensor in nested dataclasses / lists / tuples (a step's inputs)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, list | tuple):
        return type(obj)(map_tensors(o, fn) for o in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: map_tensors(getattr(obj, f.name), fn)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


@dataclass
class PendingStep:
    """A step the driver has started: the logits (filled when the works complete) and the open sends /
    receives as (work, kind for comm timing, tensor the work still reads)."""
    logits: torch.Tensor | None
    works: list[tuple[dist.Work, str, torch.Tensor | None]]


class Worker(RunnerBase):
    """One rank's shard, its KV cache and its part of each step; the driver's also prepares the batch."""

    def __init__(self, config: EngineConfig, ps: ParallelState):
        self.config, self.ps = config, ps
        self.device = ps.device
        self.platform = platform_for(self.device)
        self.platform.prepare_process()
        self.model_config = cfg = load_model_config(config.model)
        self.dtype = resolve_dtype(config, cfg, self.platform)
        self.block_size = config.block_size
        with torch.device("meta"):
            model = ShardedLlama(cfg, ps)
        model = materialize(model, self.device, self.dtype)
        model.inv_freq = rope_inv_freq(cfg).to(self.device)
        load_shard(model, config.model)
        self.model = model.eval()
        self.num_kv_heads = local_config(cfg, ps.tp_size).num_kv_heads
        # Every rank must agree on the block count: the driver's one KV cache manager hands out the slots.
        self.allocate_kv_cache(ps.min_over_world(self.kv_cache_blocks()))

    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def stats(self, reset_comm: bool = False) -> dict:
        out = {"rank": self.ps.rank, "param_bytes": self.param_bytes(), "comm_seconds": dict(self.ps.comm_seconds)}
        if reset_comm:
            self.ps.comm_seconds.clear()
        return out

    @torch.inference_mode()
    def submit(self, batch: BatchInputs, tag: int = 0) -> PendingStep | None:
        """This rank's part of one step. On the driver it returns once its own stage is computed, with
        the last stage's logits still on their way (collect() waits for them), so that with pipeline
        stages it can start the next micro-batch meanwhile; on the other ranks it returns None when done."""
        ps, cfg = self.ps, self.model_config
        x = None
        if not ps.is_first_stage:
            x = torch.empty(len(batch.input_ids), cfg.hidden_size, dtype=self.dtype, device=self.device)
            ps.recv(x, ps.rank - ps.tp_size, tag)
        hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.meta, x)
        pending = PendingStep(None, [])
        if not ps.is_last_stage:
            if ps.rank == 0:  # the driver does not wait for stage 1 to take it
                out = hidden.contiguous()
                pending.works.append((ps.isend(out, ps.rank + ps.tp_size, tag), "send", out))
            else:
                ps.send(hidden, ps.rank + ps.tp_size, tag)
        num_sampled = len(batch.sample_indices)
        logits = None
        if ps.is_last_stage and num_sampled:
            logits = self.model.lm_head(hidden[batch.sample_indices])  # None except on the last stage's tp rank 0
            if logits is not None:
                logits = logits.float()
                if ps.rank != 0:
                    ps.send(logits, 0, tag)
        if ps.rank != 0:
            return None
        if not num_sampled:
            logits = torch.empty((0, cfg.vocab_size), dtype=torch.float32, device=self.device)
        elif logits is None:
            logits = torch.empty(num_sampled, cfg.vocab_size, dtype=torch.float32, device=self.device)
            # Timed as recv: on the driver that includes waiting for the later stages' compute.
            pending.works.append((ps.irecv(logits, ps.last_stage_root, tag), "recv", None))
        pending.logits = logits
        return pending

    def collect(self, pending: PendingStep) -> torch.Tensor:
        """The driver: float32 logits [sampled rows, vocab] of a submitted step."""
        for work, kind, _ in pending.works:
            self.ps.wait(work, kind)
        return pending.logits

    def execute(self, batch: BatchInputs, tag: int = 0) -> torch.Tensor | None:
        """One whole step: logits on the driver, None on the other ranks."""
        pending = self.submit(batch, tag)
        return None if pending is None else self.collect(pending)


def serve_steps(worker: Worker, conn: Connection) -> None:
    """A non-driver rank's loop: runs what the driver sends, in order, until told to stop (or until the
    driver is gone: the connection closes)."""
    dev = worker.device
    while True:
        try:
            kind, arg = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the driver is gone
            break
        if kind == "step":
            tag, batch = arg
            worker.execute(map_tensors(batch, lambda t: t.to(dev, non_blocking=True)), tag)
        elif kind == "stats":
            conn.send_bytes(pickle.dumps(worker.stats(arg)))
        elif kind == "time_comm":
            worker.ps.time_comm = arg
        else:
            break
    dist.destroy_process_group()


def worker_main(rank: int, port: int, config: EngineConfig, conn: Connection) -> None:
    """A rank started by the local spawn: joins the group on 127.0.0.1, loads its shard, serves steps."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle; it stops us
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    base = config.resolved_device()
    platform_for(base).use_threads(config.cpu_threads, tp * pp)  # the CPU's ranks share its cores
    ps = init_parallel(rank, tp, pp, rank_device(base, rank), "127.0.0.1", port)
    serve_steps(Worker(config, ps), conn)


def remote_worker_main(rank: int, config: EngineConfig, device: torch.device, master_addr: str,
                       port: int | None) -> None:
    """A rank started by Ray or torchrun (possibly on another host): joins the group, learns the
    driver's control address from it, connects, loads its shard, serves steps. port None: torchrun's env."""
    ps = init_parallel(rank, config.tensor_parallel_size, config.pipeline_parallel_size, device, master_addr, port)
    conn = connect_to_driver(ps)
    serve_steps(Worker(config, ps), conn)
