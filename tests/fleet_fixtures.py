"""Helpers for the fleet tests: a fleet file on disk, `argosy serve` as a subprocess, child-process checks."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]


def tiny_fleet(checkpoint: str, **autoscaling) -> dict:
    auto = {"min_replicas": 1, "max_replicas": 2, "target": 1, "target_utilization": 1.0, "tick_s": 0.25,
            "stable_window_s": 4, "panic_window_s": 1, "scale_down_delay_s": 1, "drain_timeout_s": 30,
            "restart_backoff_s": 0.5, **autoscaling}
    return {"gateway": {"port": 0, "health_interval_s": 0.5},
            "models": [{"name": "tiny", "checkpoint": checkpoint, "autoscaling": auto,
                        "engine": {"kv_cache_memory_gib": 0.01, "max_num_seqs": 16, "max_num_batched_tokens": 256},
                        "admission": {"queue_timeout_s": 60}}]}


class Serve:
    """`argosy serve --config` in a subprocess; its output is kept (and readable) in `lines`."""

    def __init__(self, fleet: dict, omp_threads: str | None = "1"):
        """omp_threads: OMP_NUM_THREADS for the serve process and its replicas; None leaves it unset
        (the fleet then gives each CPU replica its share of the cores)."""
        fd, self.config = tempfile.mkstemp(suffix=".yaml", prefix="fleet-")
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(fleet, f)
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        env.update({"PYTHONPATH": str(ROOT)}, **({"OMP_NUM_THREADS": omp_threads} if omp_threads else {}))
        self.proc = subprocess.Popen([sys.executable, "-m", "argosy.cli", "serve", "--config", self.config],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.url = ""
        got = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:
                self.lines.append(line.rstrip())
                if "gateway listening on " in line:
                    self.url = line.split("listening on ", 1)[1].split(";", 1)[0].strip()
                    got.set()
            got.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not got.wait(60) or not self.url:
            self.stop()
            raise RuntimeError("argosy serve did not start:\n" + "\n".join(self.lines[-30:]))

    def fleet(self) -> dict:
        return httpx.get(self.url + "/admin/fleet", timeout=10).json()["models"][0]

    def wait_for(self, what: str, cond, timeout: float = 90.0) -> dict:
        """Poll /admin/fleet until cond(model status) holds; prints progress each second."""
        t0 = last = time.monotonic()
        while True:
            st = self.fleet()
            if cond(st):
                return st
            now = time.monotonic()
            if now - t0 > timeout:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}: {st}\n" +
                                     "\n".join(self.lines[-20:]))
            if now - last >= 1:
                states = [r["state"] + ("*" if r["pooled"] else "") for r in st["replicas"]]
                print(f"  [{now - t0:5.1f} s] waiting for {what}: replicas {states}, desired {st['desired']}",
                      flush=True)
                last = now
            time.sleep(0.2)

    def stop(self, sig: int | None = None) -> int:
        if self.proc.poll() is None:
            if sig is None:
                self.proc.terminate()
            else:
                self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.reader.join(5)
        os.unlink(self.config) if os.path.exists(self.config) else None
        return self.proc.returncode


def ready(st: dict) -> list[dict]:
    return [r for r in st["replicas"] if r["state"] == "ready" and not r["pooled"]]


def engine_pids(checkpoint: str) -> list[int]:
    """Live `argosy engine` processes serving this checkpoint (scanned from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            status = (d / "status").read_text()
        except OSError:
            continue
        if b"engine" in cmd and checkpoint.encode() in cmd and "State:\tZ" not in status:
            out.append(int(d.name))
    return out


async def wait_until(what: str, cond, timeout: float = 90.0) -> None:
    """Polls cond() on the event loop; prints progress every second; fails after timeout seconds."""
    import asyncio

    t0 = last = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        if time.monotonic() - last > 1:
            print(f"  [{time.monotonic() - t0:5.1f} s] waiting for {what}", flush=True)
            last = time.monotonic()
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def serve_in_process(fleet):
    """`argosy serve`'s app (gateway + controller, one event loop) on a free port: yields (app, client)."""
    import asyncio

    import openai
    import uvicorn

    from argosy.fleet.serve import ServeApp

    app = ServeApp(fleet)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    try:
        await wait_until("the server", lambda: server.started)
        yield app, client
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 60)
        await client.close()
