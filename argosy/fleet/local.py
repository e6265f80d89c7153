"""The local provider: each replica is an `argosy engine` subprocess on a free 127.0.0.1 port.

Children get their own session (a Ctrl-C at the terminal reaches `argosy serve` only, which then stops
them in order) and PR_SET_PDEATHSIG, so the kernel ends them if `argosy serve` dies without cleaning up.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys

from argosy.config import ModelConfig
from argosy.engine.host_cores import usable_cores
from argosy.fleet.placement import Node, detect_nodes, runs_on_gpu
from argosy.fleet.replica import Replica, ReplicaSpec

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def cpu_threads_each(models: list[ModelConfig], gpus_here: bool, cores: int | None = None) -> int | None:
    """The kernel threads of each CPU replica this machine runs: its usable cores over the most CPU
    replicas the fleet file lets run here at once (each local model's max_replicas and warm pool), at
    least 1. torch would give every replica all the cores: three replicas on two cores then ran six
    threads, whose OpenMP spin-waits took the cores from each other (BENCHMARKS.md, "Fleet"). A rollout's
    surge replicas are not counted. None: OMP_NUM_THREADS is set (the operator's, for every replica)."""
    if "OMP_NUM_THREADS" in os.environ:
        return None
    slots = 0
    for m in models:
        if m.provider != "local":
            continue
        on_cpu = [r.autoscaling.max_replicas + r.autoscaling.warm_pool for r in m.resolved().values()
                  if not runs_on_gpu(r.engine, gpus_here)]
        slots += max(on_cpu, default=0)  # a model's revisions take turns, bar a rollout's surge
    if slots == 0:
        return None
    return max(1, (cores or usable_cores()) // slots)


def engine_command(spec: ReplicaSpec, python: str | None = None, host: str = "127.0.0.1") -> list[str]:
    return [python or sys.executable, "-m", "argosy.cli", "engine", "--model", spec.checkpoint,
            "--served-model-name", spec.model, "--host", host, "--port", "0", *spec.engine_args]


class LocalProvider:
    """A ReplicaProvider (argosy.fleet.seams) on this machine."""

    name = "local"

    def __init__(self, options: dict | None = None):
        self.python = (options or {}).get("python")

    async def start(self, r: Replica) -> None:
        """Launch the process and wait until it listens (sets r.url); raises RuntimeError if it exits first."""
        env = {**os.environ, **r.spec.env}
        p = r.spec.placement
        if p is not None and p.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in p.gpus)
        proc = await asyncio.create_subprocess_exec(
            *engine_command(r.spec, self.python), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env=env, start_new_session=True, preexec_fn=die_with_parent if sys.platform == "linux" else None)
        r.handle = proc
        tail: list[str] = []
        while True:
            line = await proc.stdout.readline()
            if not line:
                await proc.wait()
                raise RuntimeError(f"exited ({proc.returncode}) before listening: {' | '.join(tail[-5:])}")
            text = line.decode(errors="replace").strip()
            tail.append(text)
            if "listening on " in text:
                r.url = text.split("listening on ", 1)[1].split(",", 1)[0].strip()
                break
        # Keep reading its output so a full pipe never blocks the child; keep the last lines for errors.
        r.log_task = asyncio.get_running_loop().create_task(self._drain_output(r, proc))

    async def _drain_output(self, r: Replica, proc) -> None:
        while line := await proc.stdout.readline():
            r.detail = line.decode(errors="replace").strip()[-300:]

    async def wait(self, r: Replica) -> None:
        """Returns when the replica's process has exited."""
        await r.handle.wait()

    def alive(self, r: Replica) -> bool:
        return r.handle is not None and r.handle.returncode is None

    async def stop(self, r: Replica, timeout: float = 10.0) -> None:
        proc = r.handle
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # its own group: anything it started goes too
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        task = getattr(r, "log_task", None)
        if task is not None:
            task.cancel()

    def kill_now(self, r: Replica) -> None:
        """Synchronous last resort (interpreter exit): SIGKILL the replica's process group."""
        if r.handle is not None and r.handle.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(r.handle.pid, signal.SIGKILL)

    async def close(self) -> None:
        pass

    async def nodes(self) -> list[Node]:
        """This machine: its GPUs (nvidia-smi) and available RAM."""
        return await asyncio.to_thread(detect_nodes, None)

    async def bind(self, listed: list[Node]) -> None:
        pass  # the fleet file's local nodes are used as written

    def down_nodes(self) -> set[str]:
        return set()  # this machine is up while this process runs
