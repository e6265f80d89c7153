"""The CPU image, built and run with podman: deploy/containers/build.sh builds it (bases from Debian
packages, no registry), `argosy serve` runs in it with its fleet file mounted, a chat completion
streams from outside through the official client, `podman stop` drains it (exit 0), and the image's
layers, size, user, labels and health check are what the Containerfile promises.

Slow (minutes; the first build on a machine also makes the Debian bases): .ci/run runs it. It installs
podman and mmdebstrap with apt when they are missing and it runs as root, as .ci/run does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pytest
import yaml

from argosy.gateway.keys import new_key
from tests.fleet_fixtures import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
IMAGE = "localhost/argosy-cpu:latest"
CONF = str(ROOT / "deploy" / "containers" / "containers.conf")
TOOLS = ("podman", "buildah", "skopeo", "mmdebstrap", "runc", "uidmap")
MAX_CPU_IMAGE_BYTES = 1.5e9  # torch's CPU wheel is most of it; a CUDA wheel would take it past 4 GB


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", CONF)}
    out = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {out.returncode}\n{out.stdout[-2000:]}\n"
                             f"{out.stderr[-2000:]}")
    return out


def container_log(name: str) -> str:
    out = podman("logs", name, check=False)  # the container's stdout and stderr come back as podman's
    return (out.stdout + out.stderr)[-3000:]


def ensure_tools() -> None:
    if shutil.which("podman") and shutil.which("mmdebstrap"):
        return
    if os.geteuid() != 0:
        pytest.fail("podman and mmdebstrap are missing and this is not root: apt-get install -y " + " ".join(TOOLS))
    print("installing " + " ".join(TOOLS) + " with apt ...", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-qq", *TOOLS], check=True, timeout=1200,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


@pytest.fixture(scope="module")
def image():
    ensure_tools()
    t0 = time.monotonic()
    # Streamed so a long first build shows its progress (each step of build.sh and of podman build).
    proc = subprocess.Popen([str(ROOT / "deploy" / "containers" / "build.sh"), "cpu"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHON": sys.executable})
    tail = []
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-40:]
        if line.startswith(("[build.sh", "STEP")) or re.match(r"\[\d+/\d+\] STEP", line):
            print("  " + line.rstrip(), flush=True)
    assert proc.wait() == 0, "build.sh failed:\n" + "\n".join(tail)
    print(f"  image built in {time.monotonic() - t0:.0f} s", flush=True)
    return IMAGE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_cpu_image_is_layered_small_and_not_root(image):
    info = json.loads(podman("image", "inspect", image).stdout)[0]
    cfg = info["Config"]
    assert cfg["User"] == "10001:10001"
    version = next(line.split('"')[1] for line in (ROOT / "pyproject.toml").read_text().splitlines()
                   if line.startswith("version = "))
    assert cfg["Labels"]["org.opencontainers.image.version"] == version
    assert cfg["Labels"]["dev.argosy.cpu-target"] == "x86-64-v3"
    health = info.get("Healthcheck") or cfg.get("Healthcheck")  # podman: top level, docker: in Config
    assert health and "/health" in " ".join(health["Test"]), info
    assert cfg["Entrypoint"][0] == "/usr/bin/tini" and cfg["StopSignal"] == "SIGTERM"
    size = info["Size"]
    print(f"  {image}: {size / 1e6:.0f} MB", flush=True)
    assert size < MAX_CPU_IMAGE_BYTES, f"the CPU image is {size / 1e9:.2f} GB"
    # Layers: the Debian base, the non-root user, the dependencies (the bulk), the application, the kernels.
    layers = [h for h in json.loads(podman("history", "--format", "json", image).stdout) if h["size"] > 0]
    layers.reverse()  # oldest first
    made_by = [h.get("CreatedBy", h.get("createdBy", "")) for h in layers]
    assert len(layers) == 5, made_by
    sizes = [h["size"] for h in layers]
    assert "useradd" in made_by[1] and all("COPY" in m for m in made_by[2:]), made_by
    assert sizes[2] == max(sizes) and sizes[0] < 250e6 and sizes[3] < 30e6 and sizes[4] < 1e6, sizes
    # No CUDA wheel, no compiler, no pip in the final image; the kernels are there, for their target.
    probe = ("import importlib.metadata as m, shutil, torch; from argosy.engine import cpu_kernels as k;"
             "print(sorted(d.metadata['Name'].lower() for d in m.distributions()), shutil.which('cc'),"
             "shutil.which('gcc'), shutil.which('pip'), torch.version.cuda, k.available())")
    out = podman("run", "--rm", "--network=none", "--no-healthcheck", "--entrypoint", "/opt/argosy/bin/python", image,
                 "-c", probe, timeout=180).stdout
    dists = out.split("]")[0]
    assert "torch" in dists and "nvidia" not in dists and "triton" not in dists, out
    assert out.strip().endswith("None None None None True"), out


def test_serve_in_the_image_streams_and_drains_on_podman_stop(image, tmp_path):
    from openai import OpenAI

    key, key_hash = new_key(os.environ["ARGOSY_KEY_PEPPER"].encode())
    fleet = tmp_path / "fleet.yaml"
    builtin = "/opt/argosy/app/argosy/models/builtin"  # the built-in model, inside the image's package
    fleet.write_text(yaml.safe_dump({"keys": [{"name": "test", "hash": key_hash}], "gateway": {"drain_timeout_s": 25},
                                     "models": [{"name": "builtin", "checkpoint": builtin,
                                                 "autoscaling": {"min_replicas": 1, "max_replicas": 1}}]}))
    fleet.chmod(0o644)
    port, name = free_port(), f"argosy-test-{uuid.uuid4().hex[:8]}"
    # The key is hashed with the tests' pepper (conftest); the container gets it as a deployment would.
    podman("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", "-v", f"{fleet}:/etc/argosy/fleet.yaml:ro",
           "-e", "ARGOSY_KEY_PEPPER", "--memory", "4g", image)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:  # the gateway answers once it listens; a first request is then held until the replica is ready
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
            assert state == "running" and time.monotonic() < deadline, container_log(name)
            time.sleep(1)

        client = OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
        assert httpx.get(url + "/v1/models", timeout=5).status_code == 401  # no key, no answer
        text, finish = "", None
        for chunk in client.chat.completions.create(model="builtin", stream=True, max_tokens=24,
                                                    messages=[{"role": "user", "content": "Tell me about Emma."}]):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        assert text and finish in ("stop", "length"), (text, finish)
        # The image's HEALTHCHECK, run on demand (this sandbox has no systemd to schedule it).
        assert podman("healthcheck", "run", name, check=False).returncode == 0

        # A stream in flight when `podman stop` comes finishes (drain), then the container exits 0.
        got, first = {"text": "", "finish": None, "error": None}, threading.Event()

        def stream() -> None:
            try:
                for chunk in client.chat.completions.create(model="builtin", stream=True, max_tokens=32,
                                                            messages=[{"role": "user", "content": "Go on."}]):
                    if chunk.choices:
                        got["text"] += chunk.choices[0].delta.content or ""
                        got["finish"] = chunk.choices[0].finish_reason or got["finish"]
                        first.set()
            except Exception as e:  # noqa: BLE001 - recorded and asserted below
                got["error"] = repr(e)
            first.set()

        t = threading.Thread(target=stream)
        t.start()
        assert first.wait(60)
        stop = podman("stop", "-t", "30", name, timeout=60)
        t.join(60)
        assert got["error"] is None and got["finish"] in ("stop", "length"), got
        code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        logs = podman("logs", name, check=False)
        assert code == "0", f"exit {code}: {stop.stderr}\n{(logs.stdout + logs.stderr)[-3000:]}"
        assert "argosy serve: stopped" in logs.stdout + logs.stderr
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)
