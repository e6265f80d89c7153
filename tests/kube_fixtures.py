"""kmock's Kubernetes emulator on 127.0.0.1 (an in-memory API server over HTTP), driven with the
official client; the test plays the kubelet (it sets Pod status) and the node lifecycle.

kmock 0.8 has no controllers, assigns no uid and no nodeName, ignores label selectors and grace
periods, and its watch streams only the objects present when it starts; the provider re-lists after
each watch (resync_s), which is the path these tests take (docs/kubernetes.md).
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
import uuid

import yaml

RESOURCES = (("v1/pods", "Pod", True), ("v1/nodes", "Node", False), ("coordination.k8s.io/v1/leases", "Lease", True),
             ("leaderworkerset.x-k8s.io/v1/leaderworkersets", "LeaderWorkerSet", True))


class KubeEmulator:
    def __init__(self, react=None):
        """`react(emulator)`, if given, adds kmock reactions (e.g. an error for one URL) before it serves."""
        import kmock

        ready, box = threading.Event(), {}

        def run() -> None:
            async def main() -> None:
                emu = kmock.KubernetesEmulator()
                for res, kind, namespaced in RESOURCES:
                    emu.resources[res] = {"kind": kind, "namespaced": namespaced}
                if react is not None:
                    react(emu)
                box["stop"] = asyncio.Event()
                async with emu, kmock.Server(emu) as srv:
                    box["url"] = str(srv.url).rstrip("/")
                    ready.set()
                    await box["stop"].wait()

            box["loop"] = asyncio.new_event_loop()
            box["loop"].run_until_complete(main())

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(30), "kmock did not start"
        self.box, self.url = box, box["url"]
        fd = tempfile.NamedTemporaryFile("w", suffix=".kubeconfig", delete=False)
        yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "kmock",
                        "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
                        "users": [{"name": "test", "user": {"token": "test"}}],
                        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}]}, fd)
        fd.close()
        self.kubeconfig = fd.name
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=self.kubeconfig, client_configuration=cfg)
        self.core = client.CoreV1Api(client.ApiClient(cfg))
        self.custom = client.CustomObjectsApi(self.core.api_client)

    def close(self) -> None:
        self.box["loop"].call_soon_threadsafe(self.box["stop"].set)
        self.thread.join(10)

    # ---- the cluster's side
    def add_node(self, name: str, gpus: int = 0, gpu_mib: int | None = None, product: str = "NVIDIA-H100",
                 memory: str = "64Gi") -> None:
        labels = {"kubernetes.io/hostname": name}
        if gpu_mib:
            labels |= {"nvidia.com/gpu.memory": str(gpu_mib), "nvidia.com/gpu.product": product}
        alloc = {"cpu": "16", "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
        self.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                               "status": {"allocatable": alloc, "capacity": alloc,
                                          "conditions": [{"type": "Ready", "status": "True"}]}})

    def set_node_ready(self, name: str, ready: bool) -> None:
        self.core.patch_node(name, {"status": {"conditions": [{"type": "Ready", "status": str(ready)}]}})

    def delete_node(self, name: str) -> None:
        self.core.delete_node(name)

    def add_controller_pod(self, name: str = "argosy-controller", namespace: str = "default") -> str:
        uid = str(uuid.uuid4())
        self.core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod",
                                                    "metadata": {"name": name, "uid": uid},
                                                    "spec": {"containers": [{"name": "c", "image": "argosy"}]}})
        return uid

    def pods(self, namespace: str = "default", component: str = "replica") -> list[dict]:
        items = self.core.api_client.sanitize_for_serialization(self.core.list_namespaced_pod(namespace).items)
        return [p for p in items if (p["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == component]

    def wait_pods(self, n: int, timeout: float = 20.0, namespace: str = "default") -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.pods(namespace)
            if len(found) >= n:
                return found
            time.sleep(0.05)
        raise AssertionError(f"expected {n} replica pods, have {len(self.pods(namespace))}")

    def leader_worker_sets(self, namespace: str = "default") -> list[dict]:
        return self.custom.list_namespaced_custom_object("leaderworkerset.x-k8s.io", "v1", namespace,
                                                         "leaderworkersets")["items"]

    # ---- the kubelet's side
    def run_pod(self, name: str, ip: str, node: str, namespace: str = "default") -> None:
        self.core.patch_namespaced_pod(name, namespace, {"spec": {"nodeName": node}, "status": {
            "phase": "Running", "podIP": ip,
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "engine", "ready": True, "restartCount": 0, "image": "argosy",
                                   "imageID": "", "state": {"running": {"startedAt": "2026-12-03T00:00:00Z"}}}]}})

    def fail_pod(self, name: str, reason: str = "Error", message: str = "", exit_code: int = 1,
                 namespace: str = "default") -> None:
        self.core.patch_namespaced_pod(name, namespace, {"status": {
            "phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "engine", "ready": False, "restartCount": 0, "image": "argosy",
                                   "imageID": "", "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                                                                           "message": message}}}]}})


class LwsController:
    """Plays the LeaderWorkerSet controller and the kubelet: each new LWS gets its group's pods (leader
    `<name>-0`, workers `<name>-0-<i>`, from its templates, with LWS's labels), each run on the node its
    affinity names with a loopback IP of its own (`serve(ip)` first starts what answers there); an LWS
    that is deleted takes its pods with it (the garbage collector's part)."""

    def __init__(self, kube: KubeEmulator, serve=None):
        self.kube, self.serve = kube, serve
        self.groups: dict[str, list[str]] = {}  # LWS name -> its pods
        self.ips: dict[str, str] = {}  # pod -> IP
        self.deleted: list[str] = []  # LWS names, in the order they went
        self.on_delete = None  # called with an LWS's name when its deletion is seen, before its pods go
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.stop.is_set():
            try:
                sets = {o["metadata"]["name"]: o for o in self.kube.leader_worker_sets()}
                for name, lws in sets.items():
                    if name not in self.groups:
                        self.groups[name] = self.make_group(lws)
                for name in [n for n in self.groups if n not in sets]:
                    if self.on_delete is not None:
                        self.on_delete(name)
                    for pod in self.groups.pop(name):
                        try:
                            self.kube.core.delete_namespaced_pod(pod, "default")
                        except Exception:  # deleted already
                            pass
                    self.deleted.append(name)
            except Exception:  # the emulator is gone: the test is over
                return
            time.sleep(0.05)

    def make_group(self, lws: dict) -> list[str]:
        name, tpl = lws["metadata"]["name"], lws["spec"]["leaderWorkerTemplate"]
        made = []
        for i in range(tpl["size"]):
            t = tpl["leaderTemplate"] if i == 0 else tpl["workerTemplate"]
            pod = f"{name}-0" if i == 0 else f"{name}-0-{i}"
            labels = {**t["metadata"]["labels"], "leaderworkerset.sigs.k8s.io/name": name,
                      "leaderworkerset.sigs.k8s.io/worker-index": str(i)}
            terms = t["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            nodes = terms["nodeSelectorTerms"][0]["matchFields"][0]["values"]
            self.kube.core.create_namespaced_pod("default", {
                "apiVersion": "v1", "kind": "Pod", "spec": t["spec"],
                "metadata": {"name": pod, "labels": labels, "annotations": t["metadata"].get("annotations", {})}})
            made.append(pod)
            self.ips[pod] = ip = f"127.0.0.{len(self.ips) + 2}"
            if self.serve is not None and i == 0:
                self.serve(ip)
            self.kube.run_pod(pod, ip, nodes[0] if i == 0 else nodes[i - 1])
        return made

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
