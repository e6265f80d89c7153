"""Regions on one machine: each region a network namespace, joined through a hub namespace (the WAN) whose
proxy adds each pair of regions' round trip (tests/netns_hub.py). Needs root and `ip`.

    hub namespace:   10.250.N.1/30 --veth-- 10.250.N.2/30 : region N's namespace (gateway, replicas)
                     10.250.0.N:PORT  region N's gateway as the other regions reach it (latency proxy)
                     unix sockets: entry-NAME (its users), relay-* (the test's view), control

Only addresses inside these namespaces and unix sockets are used: nothing reaches the host's network.
The namespaces are the test's own, so fixed ports inside them cannot collide with anything. Everything
started is stopped by its process id, and the namespaces are deleted, even when a test fails (and at
interpreter exit as a backstop).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SERVICE_PORT = 8000  # a region's gateway: on its namespace's own address, and on its service address in the hub


def skip_reason() -> str | None:
    """Why namespaced regions cannot run here (None: they can)."""
    if shutil.which("ip") is None:
        return "needs the `ip` command (iproute2) to create network namespaces"
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns add); .ci/run runs as root"
    probe = f"argosy-probe-{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot create a network namespace here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*args: str) -> None:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")


class NetnsRegions:
    def __init__(self, regions: list[str], rtt_ms: dict[str, dict[str, float]], workdir: Path,
                 entries: dict[str, list[str]]):
        self.names, self.rtt_ms, self.dir, self.entries = regions, rtt_ms, workdir, entries
        tag = f"ar{os.getpid() % 100000}"
        self.hub = f"{tag}-hub"
        self.ns = {name: f"{tag}-r{i + 1}" for i, name in enumerate(regions)}
        self.index = {name: i + 1 for i, name in enumerate(regions)}
        self.procs: dict[str, list[subprocess.Popen]] = {}
        self.by_label: dict[str, subprocess.Popen] = {}
        self.created: list[str] = []
        self.sockdir = workdir / "sock"
        self.sockdir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.down)

    def gateway_url(self, name: str) -> str:
        return f"http://10.250.0.{self.index[name]}:{SERVICE_PORT}"

    def up(self, relays: dict[str, tuple[str, int]]) -> None:
        for ns in [self.hub, *self.ns.values()]:
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for name, ns in self.ns.items():
            i = self.index[name]
            sh("ip", "-n", self.hub, "link", "add", f"h{i}", "type", "veth", "peer", "name", "wan0", "netns", ns)
            sh("ip", "-n", self.hub, "addr", "add", f"10.250.{i}.1/30", "dev", f"h{i}")
            sh("ip", "-n", self.hub, "link", "set", f"h{i}", "up")
            sh("ip", "-n", self.hub, "addr", "add", f"10.250.0.{i}/32", "dev", "lo")
            sh("ip", "-n", ns, "addr", "add", f"10.250.{i}.2/30", "dev", "wan0")
            sh("ip", "-n", ns, "link", "set", "wan0", "up")
            sh("ip", "-n", ns, "route", "add", "10.250.0.0/24", "via", f"10.250.{i}.1")
        cfg = {"regions": {n: {"index": self.index[n], "gateway_port": SERVICE_PORT} for n in self.names},
               "rtt_ms": self.rtt_ms, "entries": self.entries, "relays": relays, "sockdir": str(self.sockdir),
               "service_port": SERVICE_PORT}
        path = self.dir / "hub.json"
        path.write_text(json.dumps(cfg))
        hub = self.run("hub", self.hub, [sys.executable, str(ROOT / "tests" / "netns_hub.py"), str(path)])
        deadline = time.monotonic() + 30
        while not (self.sockdir / "control.sock").exists():
            if hub.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the hub did not start: " + self.log("hub")[-2000:])
            time.sleep(0.05)

    def run(self, label: str, ns: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.dir / f"{label}.log", "ab")
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
        p = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=log, stderr=subprocess.STDOUT, env=full_env,
                             cwd=ROOT, start_new_session=True)
        log.close()
        self.procs.setdefault(ns, []).append(p)
        self.by_label[label] = p
        return p

    def kill(self, label: str) -> None:
        """SIGKILL one process this test started (by its id)."""
        p = self.by_label.pop(label)
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
        p.wait(10)

    def log(self, label: str) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / f"{label}.log").read_text(errors="replace")
        return ""

    def pids(self, ns: str) -> list[int]:
        r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        return [int(x) for x in r.stdout.split()]

    def kill_namespace(self, ns: str) -> None:
        """SIGKILL every process in the namespace: all of them are this test's (it made the namespace)."""
        for _ in range(20):
            pids = self.pids(ns)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        for p in self.procs.pop(ns, []):
            with contextlib.suppress(Exception):
                p.wait(5)

    def kill_region(self, name: str) -> None:
        self.kill_namespace(self.ns[name])

    def control(self, **cmd) -> None:
        import socket

        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.sockdir / "control.sock"))
            s.sendall(json.dumps(cmd).encode() + b"\n")
            assert s.recv(100).startswith(b"ok"), cmd

    def http(self, relay: str, timeout: float = 10.0) -> httpx.Client:
        """A client to one relay's address (base URL http://relay)."""
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.sockdir / f"relay-{relay}.sock")),
                            base_url="http://relay", timeout=timeout)

    def wait_http(self, relay: str, path: str, ok=lambda r: r.status_code == 200, timeout: float = 60.0,
                  label: str = "", headers: dict | None = None) -> httpx.Response:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                with self.http(relay, 5) as c:
                    r = c.get(path, headers=headers)
                if ok(r):
                    return r
                last = f"HTTP {r.status_code}: {r.text[:300]}"
            except httpx.HTTPError as e:
                last = repr(e)
            time.sleep(0.2)
        raise RuntimeError(f"{relay}{path} not ready after {timeout:g} s ({last})\n" + self.log(label)[-3000:])

    def down(self) -> None:
        for ns in list(self.procs):
            self.kill_namespace(ns)
        for ns in self.created:
            self.kill_namespace(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.created = []
