"""The fleet controller with the kubernetes provider, end to end against kmock: the test plays the
kubelet (it runs each new pod as a small HTTP server on a loopback address of its own, answering
/ready, /health and /metrics) and the cluster's nodes. Scale up, a pod that fails, a node that goes
away, a scale-down that deletes the pod: each is seen in the controller's status as for other providers."""

from __future__ import annotations

import asyncio
import http.server
import socket
import threading
import time

import pytest

pytest.importorskip("kmock", reason="the test extra brings kmock (pip install -e '.[test]')")

from argosy.config import parse_fleet  # noqa: E402
from argosy.fleet.controller import Controller  # noqa: E402
from argosy.gateway.app import Gateway  # noqa: E402
from argosy.models.builtin import BUILTIN_MODEL_DIR  # noqa: E402
from tests.kube_fixtures import KubeEmulator  # noqa: E402

METRICS = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"


class Replica(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        body = METRICS if self.path == "/metrics" else b"{}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Kubelet:
    """Runs each new replica pod on the node its affinity names: an HTTP server at 127.0.0.N:port."""

    def __init__(self, kube: KubeEmulator, port: int):
        self.kube, self.port, self.servers, self.nodes = kube, port, {}, {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        n = 2
        while not self.stop.is_set():
            try:
                pods = self.kube.pods()
            except Exception:
                return
            for p in pods:
                name = p["metadata"]["name"]
                if name in self.servers:
                    continue
                terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                node = terms["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
                ip = f"127.0.0.{n}"
                n += 1
                srv = http.server.ThreadingHTTPServer((ip, self.port), Replica)
                threading.Thread(target=srv.serve_forever, daemon=True).start()
                self.servers[name], self.nodes[name] = srv, node
                self.kube.run_pod(name, ip, node)
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for srv in self.servers.values():
            srv.shutdown()
            srv.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def until(what: str, cond, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def test_the_controller_scales_replaces_and_drains_kubernetes_replicas():
    kube = KubeEmulator()
    kube.add_controller_pod()
    for name in ("cpu-a", "cpu-b"):
        kube.add_node(name, memory="16Gi")
    port = free_port()
    kubelet = Kubelet(kube, port)
    fleet = parse_fleet({
        "gateway": {"port": 0, "health_interval_s": 0.5},
        "providers": {"kubernetes": {"kubeconfig": kube.kubeconfig, "owner_pod": "argosy-controller",
                                     "resync_s": 0.3, "port": port}},
        "models": [{"name": "tiny", "checkpoint": str(BUILTIN_MODEL_DIR), "provider": "kubernetes",
                    "engine": {"kv_cache_memory_gib": 0.05, "device": "cpu"},
                    "autoscaling": {"min_replicas": 2, "max_replicas": 2, "tick_s": 0.2, "restart_backoff_s": 0.2,
                                    "drain_timeout_s": 2}}]})

    async def scenario():
        gw = Gateway(fleet)
        await gw.startup()
        ctl = Controller(fleet, gw)
        await ctl.start()
        mc = ctl.models["tiny"]
        ready = lambda: [r for r in mc.status()["replicas"] if r["state"] == "ready"]  # noqa: E731
        try:
            # Scale up: two pods, on two nodes (spread), both ready and routed.
            first = await until("two ready replicas", lambda: len(ready()) == 2 and ready())
            assert {r["node"] for r in first} == {"cpu-a", "cpu-b"}
            assert {u.url for u in gw.models["tiny"].upstreams()} == {r["url"] for r in first}
            assert {n["name"] for n in ctl.status()["nodes"]} == {"cpu-a", "cpu-b"}

            # A pod that fails: reported, and replaced.
            victim = next(r for r in mc.replicas.values() if r.state == "ready")
            kube.fail_pod(victim.handle, "Error", "engine crashed", 1)
            await until("the failure reported", lambda: mc.status()["recent_failures"])
            failure = mc.status()["recent_failures"][0]
            assert failure["id"] == victim.id and "exit 1" in failure["detail"]
            await until("a replacement", lambda: len(ready()) == 2 and victim.id not in {r["id"] for r in ready()})

            # A node that goes away: its replica is replaced on the node that is left.
            gone = next(r for r in mc.replicas.values() if r.state == "ready" and r.node == "cpu-a")
            kube.delete_node("cpu-a")
            await until("a replacement off cpu-a", lambda: len(ready()) == 2 and gone.id not in
                        {r["id"] for r in ready()})
            assert {r["node"] for r in ready()} == {"cpu-b"}

            # Scale down with drain: the controller drains a replica, then its pod is deleted.
            mc.task.cancel()  # hold the loop so the desired count does not start it again
            before = {p["metadata"]["name"] for p in kube.pods()}
            mc.reconcile(1)
            await until("one replica", lambda: len(mc.replicas) == 1, 10)
            after = {p["metadata"]["name"] for p in kube.pods()}
            assert len(after) == 1 and after < before
        finally:
            await ctl.stop()
            await gw.shutdown()
        assert kube.pods() == []  # the controller's stop deleted what it ran

    try:
        asyncio.run(scenario())
    finally:
        kubelet.close()
        kube.close()
