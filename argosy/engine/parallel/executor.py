"""The driver's side of a parallel engine: starts the other T*P-1 ranks, runs rank 0's shard, and looks
like a ModelRunner to LLMEngine (prepare / execute / num_blocks / ...), so the scheduler, the KV cache
manager and the sampler run once, here.

Each step the driver sends the prepared batch (token ids, positions, slot mapping, block tables; the
tensors on the CPU) down one pipe per worker, pickled once; every rank then runs the same forward on
its shard. Pipeline stages run one batch at a time: while a later stage computes, the earlier ones
wait (no micro-batches in flight yet).

Failure: a watchdog thread polls the workers' exit codes; a dead worker makes the next step (or the
one in progress, whose collective fails as the peer's sockets close) raise RuntimeError naming it,
and the remaining workers are stopped. Only one parallel engine per process (torch.distributed's
default group is per process).
"""

from __future__ import annotations

import pickle
import threading
import time
import weakref
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from argosy.engine.checkpoint import load_model_config
from argosy.engine.config import EngineConfig
from argosy.engine.model_runner import BatchInputs
from argosy.engine.parallel.model import check_divisible
from argosy.engine.parallel.state import free_port, init_parallel
from argosy.engine.parallel.worker import Worker, map_tensors, worker_main

WATCH_INTERVAL_S = 0.1
STOP_TIMEOUT_S = 5.0


def _shutdown(procs: list[BaseProcess], conns: list[Connection]) -> None:
    """Asks every worker to stop, then kills the ones that do not. Also runs at interpreter exit."""
    for conn in conns:
        try:
            conn.send_bytes(pickle.dumps(("stop", None)))
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1.0)
    for conn in conns:
        conn.close()
    if dist.is_initialized():
        dist.destroy_process_group()


class ParallelExecutor:
    def __init__(self, config: EngineConfig):
        tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
        check_divisible(load_model_config(config.model), tp, pp)
        base = config.resolved_device()
        if base.type == "cuda" and (base.index or 0) + tp * pp > torch.cuda.device_count():
            raise ValueError(f"tensor_parallel_size x pipeline_parallel_size = {tp * pp} needs that many GPUs "
                             f"from {base}; {torch.cuda.device_count()} are visible")
        if dist.is_initialized():
            raise RuntimeError("a parallel engine is already running in this process; close() it first")
        self.kind = "tensor-parallel" if pp == 1 else "pipeline-parallel" if tp == 1 else "parallel"
        self.error: str | None = None
        self.procs: list[BaseProcess] = []
        self.conns: list[Connection] = []
        port = free_port()
        ctx = mp.get_context("spawn")
        for rank in range(1, tp * pp):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(rank, port, config, child), name=f"argosy-rank-{rank}",
                            daemon=True)
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        self._finalizer = weakref.finalize(self, _shutdown, self.procs, self.conns)
        try:
            self.worker: Worker = self._watched(lambda: Worker(config, init_parallel(0, tp, pp, port, base)))
        except BaseException:
            self.close()
            raise
        if base.type == "cuda":
            torch.cuda.set_device(self.worker.device)  # the worker was built in another thread
        w = self.worker
        self.config, self.device, self.dtype, self.block_size = config, w.device, w.dtype, w.block_size
        self.model_config, self.num_blocks, self.kv_caches = w.model_config, w.num_blocks, w.kv_caches
        self.prepare = w.prepare
        self.kv_bytes_per_block = w.kv_bytes_per_block
        threading.Thread(target=self._watch, args=(weakref.ref(self),), name="argosy-worker-watchdog",
                         daemon=True).start()

    # -- failure detection ----------------------------------------------------------------------------
    def _dead_worker(self) -> str | None:
        for rank, p in enumerate(self.procs, start=1):
            if p.exitcode is not None:
                return f"{self.kind} worker {rank} exited with code {p.exitcode}"
        return None

    @staticmethod
    def _watch(ref: weakref.ref) -> None:
        # Holds the executor only weakly, so an engine dropped without close() is still collected
        # (and its finalizer stops the workers).
        while (ex := ref()) is not None and ex.error is None and ex._finalizer.alive:
            ex.error = ex._dead_worker()
            if ex.error is not None and ex.device.type == "cuda":
                # NCCL would otherwise wait out the collective timeout on a dead peer; gloo fails at once.
                try:
                    dist.distributed_c10d._abort_process_group()
                except Exception:  # noqa: BLE001 - best effort: the step still fails on the timeout
                    pass
            del ex
            time.sleep(WATCH_INTERVAL_S)

    def _fail(self, exc: BaseException) -> RuntimeError:
        """Turns a failed collective into the error that names the dead worker (it may take a moment
        to be reaped), and stops the others: the engine cannot continue without all its ranks."""
        deadline = time.monotonic() + 2.0
        while self.error is None and time.monotonic() < deadline:
            self.error = self._dead_worker()
            time.sleep(0.02)
        if self.error is None:
            self.error = f"{self.kind} step failed: {exc}"
        self.close()
        return RuntimeError(self.error)

    def _watched(self, fn):
        """Runs fn (start-up: joining the group, loading the shard) in a thread while watching the workers,
        so a worker that dies before joining fails the start-up instead of hanging it."""
        result: dict = {}

        def run():
            try:
                result["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                result["error"] = e

        t = threading.Thread(target=run, name="argosy-rank-0-start", daemon=True)
        t.start()
        while t.is_alive():
            t.join(WATCH_INTERVAL_S)
            dead = self._dead_worker()
            if dead is not None and t.is_alive():
                raise RuntimeError(f"{dead} while the engine was starting")
        if "error" in result:
            dead = self._dead_worker()
            if dead is not None:
                raise RuntimeError(f"{dead} while the engine was starting") from result["error"]
            raise result["error"]
        return result["value"]

    # -- the ModelRunner interface ---------------------------------------------------------------------
    def execute(self, batch: BatchInputs) -> torch.Tensor:
        if self.error is not None:
            self.close()  # the watchdog saw a worker die while the engine was idle
            raise RuntimeError(self.error)
        # The workers get no Sequence objects, and tensors on the CPU (each rank moves them to its device).
        portable = map_tensors(BatchInputs(batch.input_ids, batch.positions, batch.meta, batch.sample_indices, []),
                               lambda t: t.cpu())
        blob = pickle.dumps(("step", portable), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            for conn in self.conns:
                conn.send_bytes(blob)
            return self.worker.execute(batch)
        except Exception as e:
            raise self._fail(e) from e
        except BaseException:  # Ctrl-C mid-step: the ranks are out of step for good
            self.error = f"a {self.kind} step was interrupted; the engine must be restarted"
            self.close()
            raise

    def set_comm_timing(self, on: bool) -> None:
        """Every rank accumulates the seconds it spends in each communication op (see stats())."""
        msg = pickle.dumps(("time_comm", on))
        try:
            for conn in self.conns:
                conn.send_bytes(msg)
        except Exception as e:
            raise self._fail(e) from e
        self.worker.ps.time_comm = on

    def stats(self, reset_comm: bool = False) -> list[dict]:
        """Per rank (driver first): parameter bytes and, while comm timing is on, seconds in each comm op."""
        if self.error is not None:
            self.close()
            raise RuntimeError(self.error)
        msg = pickle.dumps(("stats", reset_comm))
        try:
            for conn in self.conns:
                conn.send_bytes(msg)
            out = [self.worker.stats(reset_comm)]
            for conn in self.conns:
                if not conn.poll(30):
                    raise TimeoutError("a worker did not answer within 30 s")
                out.append(pickle.loads(conn.recv_bytes()))
            return out
        except Exception as e:
            raise self._fail(e) from e

    def close(self) -> None:
        """Stops the workers and leaves the process group. Idempotent; also runs at interpreter exit."""
        self._finalizer()
