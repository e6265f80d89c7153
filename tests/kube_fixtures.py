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

RESOURCES = (("v1/pods", "Pod", True), ("v1/nodes", "Node", False), ("coordination.k8s.io/v1/leases", "Lease", True))


class KubeEmulator:
    def __init__(self):
        import kmock

        ready, box = threading.Event(), {}

        def run() -> None:
            async def main() -> None:
                emu = kmock.KubernetesEmulator()
                for res, kind, namespaced in RESOURCES:
                    emu.resources[res] = {"kind": kind, "namespaced": namespaced}
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
