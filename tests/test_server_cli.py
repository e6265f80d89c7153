"""`python -m argosy.server`: startup lines, --port 0, and failing loudly when the model cannot load."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.server_fixtures import ROOT

SERVER = ("argosy.server",)
ARGOSY_ENGINE = ("argosy.cli", "engine")  # what the `argosy engine` console script runs


def _start(*args: str, command: tuple[str, ...] = SERVER) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", *command, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("command", [SERVER, ARGOSY_ENGINE])
def test_port_zero_prints_the_real_port_then_ready(tiny_llama, command):
    proc = _start("--model", tiny_llama, "--port", "0", "--kv-cache-memory", "0.01", command=command)
    try:
        listening = proc.stdout.readline()
        match = re.search(r"listening on (http://127\.0\.0\.1:(\d+))", listening)
        assert match and int(match.group(2)) > 0, listening
        url = match.group(1)
        ready = proc.stdout.readline()  # printed once the model is loaded and warmed up
        assert "ready" in ready and url in ready, ready
        assert httpx.get(url + "/ready").status_code == 200
        models = httpx.get(url + "/v1/models").json()["data"]
        assert models[0]["id"] == os.path.basename(tiny_llama) and models[0]["max_model_len"] == 2048
    finally:
        proc.terminate()
        # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status says why it ended.
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        assert "Traceback" not in proc.stdout.read()
        proc.stdout.close()


def test_missing_checkpoint_exits_with_a_message(tmp_path):
    proc = _start("--model", str(tmp_path / "nothing"), "--port", "0")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "no checkpoint" in out


def test_a_model_that_fails_to_load_stops_the_server(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    proc = _start("--model", str(tmp_path), "--port", "0")
    start = time.monotonic()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "failed" in out, out
    assert time.monotonic() - start < 120
