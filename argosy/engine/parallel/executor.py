"""The driver's side of a parallel engine: starts the other T*P-1 ranks (launch.py), runs rank 0's
shard, and is a Runner to LLMEngine (model_runner.py: prepare / execute / submit / collect ...), so the
scheduler, the KV cache manager and the sampler run once, here.

Each step the driver sends the prepared batch (token ids, positions, slot mapping, block tables; the
tensors on the CPU) down one connection per worker, pickled once; every rank then runs the same
forward on its shard. With P pipeline stages LLMEngine keeps up to P micro-batches in flight:
submit() returns once stage 0 (the driver's) has computed, and collect() waits for the last stage's
logits, so stage 0 computes batch k+1 while stage 1 computes batch k.

Failure: a watchdog thread polls the workers; a dead worker makes the next step (or the one in
progress, whose collective fails as the peer's sockets close) raise RuntimeError naming it, and the
remaining workers are stopped. Only one parallel engine per process (torch.distributed's default group
is per process).
"""

from __future__ import annotations

import itertools
import pickle
import threading
import time
import weakref

import torch
import torch.distributed as dist

from argosy.engine.batch import BatchInputs
from argosy.engine.checkpoint import load_model_config
from argosy.engine.config import EngineConfig
from argosy.engine.parallel.launch import driver_worker, run_if_worker_rank, start_ranks
from argosy.engine.parallel.model import check_divisible
from argosy.engine.parallel.worker import PendingStep, Worker, map_tensors

WATCH_INTERVAL_S = 0.1
TAG_LIMIT = 1 << 30  # p2p tags are step numbers modulo this


class ParallelExecutor:
    def __init__(self, config: EngineConfig):
        tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
        check_divisible(load_model_config(config.model), tp, pp)
        if run_if_worker_rank(config):  # torchrun, rank > 0: this process was a worker; the driver is done
            raise SystemExit(0)
        if dist.is_initialized():
            raise RuntimeError("a parallel engine is already running in this process; close() it first")
        self.kind = "tensor-parallel" if pp == 1 else "pipeline-parallel" if tp == 1 else "parallel"
        self.error: str | None = None
        self.ranks = start_ranks(config)
        self.procs = self.ranks.procs  # local spawn only
        self.conns = self.ranks.conns
        self._finalizer = weakref.finalize(self, self.ranks.shutdown)
        try:
            self.worker: Worker = self._watched(lambda: driver_worker(config, self.ranks))
        except BaseException:
            self.close()
            raise
        if self.ranks.driver_device.type == "cuda":
            torch.cuda.set_device(self.worker.device)  # the worker was built in another thread
        w = self.worker
        self.config, self.device, self.dtype, self.block_size = config, w.device, w.dtype, w.block_size
        self.model_config, self.num_blocks, self.kv_caches = w.model_config, w.num_blocks, w.kv_caches
        self.prepare = w.prepare
        self.kv_bytes_per_block = w.kv_bytes_per_block
        self.pipeline_depth = pp  # micro-batches LLMEngine keeps in flight
        self._step_ids = itertools.count()
        threading.Thread(target=self._watch, args=(weakref.ref(self),), name="argosy-worker-watchdog",
                         daemon=True).start()

    # -- failure detection ----------------------------------------------------------------------------
    def _dead_worker(self) -> str | None:
        dead = self.ranks.dead()
        return None if dead is None else f"{self.kind} {dead}"

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

    def _check(self) -> None:
        if self.error is not None:
            self.close()  # the watchdog saw a worker die while the engine was idle
            raise RuntimeError(self.error)

    def _guarded(self, fn):
        try:
            return fn()
        except Exception as e:
            raise self._fail(e) from e
        except BaseException:  # Ctrl-C mid-step: the ranks are out of step for good
            self.error = f"a {self.kind} step was interrupted; the engine must be restarted"
            self.close()
            raise

    # -- the Runner interface (model_runner.py) --------------------------------------------------------
    def submit(self, batch: BatchInputs) -> PendingStep:
        """Starts a step on every rank; returns once the driver's own stage is done (see collect)."""
        self._check()
        tag = next(self._step_ids) % TAG_LIMIT
        # The workers get no Sequence objects, and tensors on the CPU (each rank moves them to its device).
        portable = map_tensors(BatchInputs(batch.input_ids, batch.positions, batch.meta, batch.sample_indices, []),
                               lambda t: t.cpu())
        blob = pickle.dumps(("step", (tag, portable)), protocol=pickle.HIGHEST_PROTOCOL)

        def run():
            for conn in self.conns:
                conn.send_bytes(blob)
            return self.worker.submit(batch, tag)

        return self._guarded(run)

    def collect(self, pending: PendingStep) -> torch.Tensor:
        """float32 logits [sampled rows, vocab] of a submitted step, once the last stage sends them."""
        self._check()
        return self._guarded(lambda: self.worker.collect(pending))

    def execute(self, batch: BatchInputs) -> torch.Tensor:
        return self.collect(self.submit(batch))

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
        """Per rank (driver first): parameter bytes and, while comm timing is on, seconds in each comm op.
        Only between steps (no micro-batch in flight): the answers come back on the step connections."""
        self._check()
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
