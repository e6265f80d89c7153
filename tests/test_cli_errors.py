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
    fleet = Path(tiny_llama).parent / "tp3.yaml"
    fleet.write_text(f"models:\n  - name: m\n    checkpoint: {tiny_llama}\n    engine: {{tensor_parallel_size: 3}}\n")
    for command in (["config", "check"], ["serve", "--port", "0", "--config"]):
        done = argosy(*command, str(fleet))  # config check had said ok; serve's replicas failed one after another
        assert done.returncode == 2
        assert "engine.tensor_parallel_size 3 must divide the model's num_attention_heads" in done.stderr
        assert "Traceback" not in done.stderr


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


def test_fleet_file_mistakes_yaml_accepts_silently_are_one_line(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_bytes(b"\xff\xfe models: []\n")  # not UTF-8 text: had been UnicodeDecodeError's traceback
    for command in ("config check", "serve --port 0 --config"):
        done = argosy(*command.split(), str(fleet), timeout=60)
        assert done.returncode == 2 and f"{fleet}: not UTF-8 text" in one_line(done.stderr)
    # A section given twice: YAML keeps the last, so the first `models:` had been dropped without a word.
    fleet.write_text("models:\n  - {name: a, checkpoint: builtin}\nmodels:\n  - {name: b, checkpoint: builtin}\n")
    done = argosy("config", "check", str(fleet))
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert f"{fleet}:3:1:" in line and "'models' given twice" in line
    fleet.write_text("models:\n  - name: a\n    checkpoint: builtin\n    autoscaling: {min_replicas: 1}\n"
                     "    autoscaling: {max_replicas: 2}\n")
    done = argosy("config", "check", str(fleet))
    assert done.returncode == 2 and f"{fleet}:5:5:" in one_line(done.stderr)
    # YAML's merge keys still override what they merge
    fleet.write_text("models:\n  - name: a\n    checkpoint: builtin\n"
                     "    autoscaling: &auto {min_replicas: 1, max_replicas: 2}\n"
                     "  - name: b\n    checkpoint: builtin\n    autoscaling: {<<: *auto, max_replicas: 3}\n")
    done = argosy("config", "check", str(fleet))
    assert done.returncode == 0, done.stderr
    # a model with no name: had been served under "" (and `--served-model-name ''` too)
    fleet.write_text("models:\n  - {name: '', checkpoint: builtin}\n")
    done = argosy("config", "check", str(fleet))
    assert done.returncode == 2 and "models.0.name: String should have at least 1 character" in done.stderr


@pytest.mark.parametrize("flag, value", [("--replicas", "0"), ("--replicas", "-1"), ("--kv-cache-memory", "0"),
                                         ("--kv-cache-memory", "nan")])
def test_serve_refuses_a_replica_count_or_kv_size_of_zero(flag, value):
    # 0 had been taken as "not given" (one replica, the default KV size) and served without a word
    done = argosy("serve", "--model", "builtin", "--port", "0", flag, value, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"argosy serve: error: argument {flag}: {value!r} is not ")


def test_a_model_name_given_twice_is_refused(tmp_path):
    # Two entries named `a` with other revisions passed; the gateway and the controller hold models by name,
    # so the second replaced the first while the first's replicas still ran, unlisted and never routed.
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("models:\n  - {name: a, checkpoint: builtin, revision: v1}\n"
                     "  - {name: a, checkpoint: builtin, revision: v2}\n")
    done = argosy("config", "check", str(fleet))
    assert done.returncode == 2 and "model 'a' appears twice" in done.stderr


def test_serve_and_config_check_on_weights_cut_short_are_one_line(tiny_llama, tmp_path):
    import shutil

    folder = tmp_path / "cut-short"  # a download that stopped half way: the safetensors header does not read
    shutil.copytree(tiny_llama, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    done = argosy("serve", "--model", str(folder), "--port", "0", timeout=60)  # had been SafetensorError's traceback
    assert done.returncode == 2
    assert one_line(done.stderr).startswith(f"argosy serve: model 'cut-short': {folder}: its weights do not read: ")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"models:\n  - {{name: m, checkpoint: {folder}}}\n")
    done = argosy("config", "check", str(fleet))
    assert done.returncode == 2 and "Traceback" not in done.stderr and "its weights do not read" in done.stderr


@pytest.mark.parametrize("flag, value", [("--replicas", "3"), ("--served-model-name", "other"),
                                         ("--kv-cache-memory", "1")])
def test_serve_flags_for_model_alone_are_refused_with_a_fleet_file_that_has_models(tmp_path, flag, value):
    # They had been ignored without a word: `--replicas 3` with a fleet file served its own replica count.
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("models:\n  - {name: m, checkpoint: builtin}\n")
    done = argosy("serve", "--config", str(fleet), "--port", "0", flag, value, timeout=60)
    assert done.returncode == 2
    assert one_line(done.stderr).startswith(f"argosy serve: {flag} goes with --model (or a fleet file with no models)")


def test_serve_starts_when_its_local_admin_credential_cannot_be_written(tmp_path):
    # A read-only home (a container) or a state folder that is a file: had been NotADirectoryError's
    # traceback after the gateway had bound its port. The credential is a convenience: serve without it.
    (tmp_path / "file").write_text("")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("models:\n  - {name: m, checkpoint: builtin, autoscaling: {min_replicas: 0, max_replicas: 1}}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ARGOSY_ADMIN_FILE": str(tmp_path / "file" / "admin.json")}
    proc = subprocess.Popen([sys.executable, "-m", "argosy.cli", "serve", "--config", str(fleet), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                            stdin=subprocess.DEVNULL)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "no local admin credential" in line or "Traceback" in line:
                break
        assert any("gateway listening on" in line for line in lines), "".join(lines)
        assert any(line.startswith("argosy serve: no local admin credential") for line in lines), "".join(lines)
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("state, why", [("{not json", "is not valid JSON"), (None, "cannot be read")])
def test_serve_with_a_rollout_state_file_it_cannot_read_is_one_line(tmp_path, state, why):
    # Had been uvicorn's "Exception in 'lifespan' protocol" traceback (the file's message inside it), then
    # "Application startup failed" and an unclosed aiohttp session, exit 3; or NotADirectoryError's traceback.
    path = tmp_path / "state.json"
    if state is None:
        (tmp_path / "file").write_text("")
        path = tmp_path / "file" / "state.json"  # its folder is a file
    else:
        path.write_text(state)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"state_file: {path}\nmodels:\n  - {{name: m, checkpoint: builtin, "
                     "autoscaling: {min_replicas: 0, max_replicas: 1}}\n")
    done = argosy("serve", "--config", str(fleet), "--port", "0", timeout=60)
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert line.startswith(f"argosy serve: {path}: the rollout state file ") and why in line


def test_serve_with_a_local_python_that_is_not_there_is_one_line(tmp_path):
    # Had started, and every replica failed at once and again, backing off, with only
    # "FileNotFoundError: [Errno 2] No such file or directory" in `argosy status` (no path named).
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"providers: {{local: {{python: {tmp_path / 'venv' / 'bin' / 'python'}}}}}\n"
                     "models:\n  - {name: m, checkpoint: builtin}\n")
    done = argosy("serve", "--config", str(fleet), "--port", "0", timeout=60)
    assert done.returncode == 2
    assert one_line(done.stderr) == (f"argosy serve: providers.local.python: {tmp_path / 'venv' / 'bin' / 'python'} "
                                     "is not an executable file (the interpreter that runs the replicas)")


def test_a_key_hash_copied_from_an_example_is_one_line(tmp_path):
    fleet = tmp_path / "fleet.yaml"  # the examples write `hash: "scrypt:..."` for a hash to fill in
    fleet.write_text('keys:\n  - {name: eu-customer, hash: "scrypt:..."}\n'
                     'models:\n  - {name: m, checkpoint: builtin}\n')
    for command in (["config", "check"], ["serve", "--port", "0", "--config"], ["gateway", "--port", "0", "--config"]):
        done = argosy(*command, str(fleet))  # serve and gateway had died on a ValueError traceback, check said ok
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "key 'eu-customer': its hash is not an argosy key hash" in done.stderr
        assert "argosy keys add NAME --config FLEET_FILE" in done.stderr
