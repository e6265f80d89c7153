"""Start `python -m argosy.server` as a real subprocess on a free port, and read its /metrics.

The checkpoint comes from conftest's `tiny_llama` (argosy.engine.random_model); swap it there.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "tiny-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One engine server; `stop()` (or the context manager) ends it and everything it started.
    `extra` flags come last, so they override the defaults here (e.g. "--kv-cache-memory", "1")."""

    def __init__(self, model: str, *extra: str, served_name: str = MODEL_NAME, timeout_s: float = 180.0,
                 env: dict[str, str] | None = None, wait: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"
        self.model_name = served_name
        # Output goes to a file, not a pipe: nobody drains a pipe while tests run, and a full pipe blocks.
        self._log = tempfile.NamedTemporaryFile(prefix="argosy-server-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "argosy.server", "--model", model, "--served-model-name", served_name,
               "--host", "127.0.0.1", "--port", str(self.port), "--kv-cache-memory", "0.02", *extra]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        if not wait:  # the caller calls wait_ready() (several servers then load at once)
            return
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready after {timeout_s} s:\n{self.output()}")

    def output(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        return parse_metrics(httpx.get(self.url + "/metrics", timeout=10).text)

    def stop(self) -> None:
        if self._log.closed:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        os.unlink(self._log.name)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} with labels as written, plus each name's samples."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            name, labels, value = match.groups()
            samples[name + (labels or "")] = float(value)
    return samples


def metric(samples: dict[str, float], name: str, **labels: str) -> float:
    """The value of `name` whose labels include `labels` (0.0 when absent)."""
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base == name and all(f'{k}="{v}"' in rest for k, v in labels.items()):
            return value
    return 0.0
