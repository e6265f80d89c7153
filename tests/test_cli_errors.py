"""A person's common mistakes get one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import io
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from argosy.observe.logs import JsonFormatter, TextFormatter, setup_logging

ROOT = Path(__file__).resolve().parents[1]


def argosy(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "argosy.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT, stdin=subprocess.DEVNULL)


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


def test_gateway_on_a_port_in_use(busy_port):
    done = argosy("gateway", "--port", str(busy_port))
    assert done.returncode != 0
    assert "already in use" in one_line(done.stderr) and f":{busy_port}" in done.stderr


def test_engine_on_a_port_in_use(busy_port, tiny_llama):
    done = argosy("engine", "--model", tiny_llama, "--port", str(busy_port))
    assert done.returncode != 0
    assert "already in use" in one_line(done.stderr)


@pytest.mark.parametrize("command", [["engine", "--model", "builtin"], ["gateway"], ["serve", "--model", "builtin"]])
@pytest.mark.parametrize("port", ["70000", "-5", "http"])
def test_a_port_out_of_range_is_one_line(command, port):
    done = argosy(*command, "--port", port)  # had been OverflowError's traceback from bind()
    assert done.returncode == 2 and "Traceback" not in done.stderr
    # argparse's usage, then its one error line
    assert done.stderr.splitlines()[-1].endswith(f"argument --port: {port!r} is not a port: 0 (any free one) to 65535")


def test_a_tensor_parallel_size_the_model_cannot_split_over_is_one_line(tiny_llama):
    done = argosy("engine", "--model", tiny_llama, "--tensor-parallel-size", "3", "--port", "0")
    assert done.returncode != 0
    line = one_line(done.stderr)  # had been the engine thread's traceback, then the same words again
    assert "--tensor-parallel-size 3 must divide the model's num_attention_heads" in line


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("gateway:\n  port: 0\nmodels:\n  - name: m\n    upstreams: [http://127.0.0.1:1\n")
    done = argosy("gateway", "--config", str(fleet))
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert f"{fleet}:" in line and "YAML syntax error" in line and "line 5" in line


def test_bench_against_an_unreachable_url():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = argosy("bench", "--url", f"http://127.0.0.1:{port}", "--num-requests", "1", "--concurrency", "1",
                  "--model", "m")
    assert done.returncode != 0
    assert "cannot reach" in one_line(done.stderr)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream, fmt, formatter", [(io.StringIO(), "auto", JsonFormatter),
                                                    (_Terminal(), "auto", TextFormatter),
                                                    (_Terminal(), "json", JsonFormatter)])
def test_logs_are_text_on_a_terminal_and_json_otherwise(monkeypatch, stream, fmt, formatter):
    monkeypatch.setattr(sys, "stderr", stream)
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    try:
        setup_logging(fmt)
        assert isinstance(root.handlers[0].formatter, formatter)
    finally:
        root.handlers[:], root.level = saved


def test_serve_a_checkpoint_whose_config_describes_no_model(tiny_llama, tmp_path):
    """Before: serve started, and its replicas failed one after another (backing off), the reason only in
    their detail; now one line and exit 2 before anything starts."""
    import json
    import shutil

    folder = tmp_path / "no-heads"
    shutil.copytree(tiny_llama, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_attention_heads": 0}))
    done = argosy("serve", "--model", str(folder), "--port", "0", timeout=60)
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert line.startswith("argosy serve: model ") and "num_heads is 0" in line


def test_a_test_model_into_a_folder_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    done = argosy("make-test-model", str(tmp_path / "file" / "model"))  # had been the writer's traceback
    assert done.returncode == 2
    target = tmp_path / "file" / "model"
    assert one_line(done.stderr) == f"argosy make-test-model: cannot write {target}: Not a directory"


def test_the_scheduler_extender_without_a_cluster_or_its_port_is_one_line(tmp_path, busy_port):
    # No kubeconfig and no in-cluster service: had been the kubernetes client's ConfigException traceback.
    env_home = {"HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none")}
    done = subprocess.run([sys.executable, "-m", "argosy.cli", "scheduler-extender", "--port", "0"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, stdin=subprocess.DEVNULL,
                          env={k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
                          | env_home | {"PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and "no Kubernetes API to reach" in one_line(done.stderr)
    done = argosy("scheduler-extender", "--no-api", "--host", "127.0.0.1", "--port", str(busy_port))
    assert done.returncode == 2 and "already in use" in one_line(done.stderr)
