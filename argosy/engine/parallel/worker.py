"""One rank: its model shard, its KV cache (its layers, its KV heads), and its part of each step.

The driver (rank 0) holds a Worker too, and also prepares the batch (`ModelRunner.prepare`). Other
ranks run `worker_main`: they wait on a pipe for the driver's next step, so an idle engine has no
collective waiting to time out, and a driver that dies closes the pipe and so ends them.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from argosy.engine.checkpoint import load_model_config
from argosy.engine.config import EngineConfig
from argosy.engine.model_runner import BatchInputs, ModelRunner, resolve_dtype
from argosy.engine.models.llama import rope_inv_freq
from argosy.engine.parallel.model import ShardedLlama, load_shard, local_config
from argosy.engine.parallel.state import ParallelState, init_parallel


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


class Worker(ModelRunner):
    # ModelRunner.__init__ is not called: it would load the whole model. prepare() needs only
    # block_size and device, and _num_kv_blocks() our kv_bytes_per_block().
    def __init__(self, config: EngineConfig, ps: ParallelState):
        self.config, self.ps = config, ps
        self.device = ps.device
        self.model_config = cfg = load_model_config(config.model)
        self.dtype = resolve_dtype(config, cfg, self.device)
        self.block_size = config.block_size
        with torch.device("meta"):
            model = ShardedLlama(cfg, ps)
        model = model.to_empty(device=self.device).to(self.dtype)
        model.inv_freq = rope_inv_freq(cfg).to(self.device)
        load_shard(model, config.model)
        self.model = model.eval()
        self.num_kv_heads = local_config(cfg, ps.tp_size).num_kv_heads
        # Every rank must agree on the block count: the driver's one KV cache manager hands out the slots.
        self.num_blocks = ps.min_over_world(self._num_kv_blocks())
        shape = (2, self.num_blocks, self.block_size, self.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in model.layers]

    def kv_bytes_per_block(self) -> int:
        """This rank's bytes per block: its layers and its KV heads (kv_cache_memory_gib is per rank)."""
        elem = torch.finfo(self.dtype).bits // 8
        return 2 * len(self.model.layers) * self.block_size * self.num_kv_heads * self.model_config.head_dim * elem

    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def stats(self, reset_comm: bool = False) -> dict:
        out = {"rank": self.ps.rank, "param_bytes": self.param_bytes(), "comm_seconds": dict(self.ps.comm_seconds)}
        if reset_comm:
            self.ps.comm_seconds.clear()
        return out

    @torch.inference_mode()
    def execute(self, batch: BatchInputs) -> torch.Tensor | None:
        """This rank's part of one step. Returns float32 logits [sampled rows, vocab] on the driver,
        None on the other ranks."""
        ps, cfg = self.ps, self.model_config
        x = None
        if not ps.is_first_stage:
            x = torch.empty(len(batch.input_ids), cfg.hidden_size, dtype=self.dtype, device=self.device)
            ps.recv(x, ps.rank - ps.tp_size)
        hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.meta, x)
        if not ps.is_last_stage:
            ps.send(hidden, ps.rank + ps.tp_size)
        num_sampled = len(batch.sample_indices)
        logits = None
        if ps.is_last_stage and num_sampled:
            logits = self.model.lm_head(hidden[batch.sample_indices])  # None except on the last stage's tp rank 0
            if logits is not None:
                logits = logits.float()
                if ps.rank != 0:
                    ps.send(logits, 0)
        if ps.rank != 0:
            return None
        if not num_sampled:
            return torch.empty((0, cfg.vocab_size), dtype=torch.float32, device=self.device)
        if logits is None:
            logits = ps.recv(torch.empty(num_sampled, cfg.vocab_size, dtype=torch.float32, device=self.device),
                             ps.last_stage_root)
        return logits


def worker_main(rank: int, port: int, config: EngineConfig, conn: Connection) -> None:
    """A non-driver rank: joins the group, loads its shard, then runs what the driver sends until told
    to stop (or until the driver is gone)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle; it stops us
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    base = config.resolved_device()
    if base.type == "cpu":  # the ranks share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // (tp * pp)))
    ps = init_parallel(rank, tp, pp, port, base)
    worker = Worker(config, ps)
    dev = ps.device
    while True:
        try:
            kind, arg = pickle.loads(conn.recv_bytes())
        except EOFError:  # the driver is gone
            break
        if kind == "step":
            worker.execute(map_tensors(arg, lambda t: t.to(dev, non_blocking=True)))
        elif kind == "stats":
            conn.send_bytes(pickle.dumps(worker.stats(arg)))
        elif kind == "time_comm":
            ps.time_comm = arg
        else:
            break
    dist.destroy_process_group()
