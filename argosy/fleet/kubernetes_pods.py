"""What the Kubernetes provider sends and reads: replica Pod (and LeaderWorkerSet) manifests, nodes
from Node objects, and what a Pod's status says about its replica. Plain dicts in the API's JSON shape,
so the same code serves the official client and the tests.

A replica Pod runs the image's `argosy engine` on a fixed port, pinned by node affinity to the node
the placer chose (or, with `scheduler_name`, left to kube-scheduler and Argosy's extender). Whole GPUs
are requested from the device plugin (`nvidia.com/gpu`); a replica that shares a GPU by memory (its
model's `kv_cache_memory_gib` is set) names its GPU in CUDA_VISIBLE_DEVICES instead, from the
`argosy.dev/gpus` annotation, as the placer (or the extender's bind) wrote it. Readiness is `/ready`;
the preStop hook waits for in-flight requests (argosy.fleet.drain_hook); the owner reference to the
controller's pod makes Kubernetes delete the replicas with it.
"""

from __future__ import annotations

import math
import re

from argosy.config_providers import KubernetesProviderOptions
from argosy.fleet.placement import GPU, Need, Node, Placement

GIB = 1024 ** 3
LABEL = "argosy.dev"  # labels and annotations
COMPONENT = "app.kubernetes.io/component"
LWS_GROUP, LWS_VERSION, LWS_PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda error: out of memory", "oomkilled")


def dns_label(text: str, limit: int = 40) -> str:
    """A DNS-1123 label fragment (lower case, digits, dashes) from any model name."""
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (s[:limit].rstrip("-") or "model")


def label_value(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63].strip("-._")
    return s or "x"


def engine_args(spec_model: str, checkpoint: str, engine_args: list[str], port: int) -> list[str]:
    return ["engine", "--model", checkpoint, "--served-model-name", spec_model, "--host", "0.0.0.0",
            "--port", str(port), *engine_args]


def replica_pod(name: str, replica_id: str, model: str, checkpoint: str, args: list[str], env: dict[str, str],
                placement: Placement | None, opts: KubernetesProviderOptions, controller: str,
                owner: dict | None) -> dict:
    """The Pod of one replica."""
    need = placement.need if placement else Need(0, 0.0)
    labels = {**opts.labels, "app.kubernetes.io/name": "argosy", COMPONENT: "replica",
              f"{LABEL}/model": label_value(model), f"{LABEL}/replica": replica_id,
              f"{LABEL}/controller": label_value(controller)}
    annotations = {f"{LABEL}/model": model, f"{LABEL}/need-gpus": str(need.gpus),
                   f"{LABEL}/need-gib": "whole" if need.gib == float("inf") else f"{need.gib:g}"}
    if placement is not None:
        annotations[f"{LABEL}/node"] = placement.node
        if placement.gpus and not opts.scheduler_name:
            annotations[f"{LABEL}/gpus"] = ",".join(map(str, placement.gpus))
    resources: dict[str, dict[str, str]] = {"requests": {"cpu": opts.cpu}, "limits": {}}
    if opts.cpu_limit:
        resources["limits"]["cpu"] = opts.cpu
    container_env = [{"name": k, "value": v} for k, v in {**opts.env, **env}.items()]
    if need.gpus and need.gib == float("inf"):
        resources["requests"][opts.gpu_resource] = resources["limits"][opts.gpu_resource] = str(need.gpus)
    elif need.gpus:  # shares a GPU by memory: the device plugin cannot split one, the annotation names it
        ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{LABEL}/gpus']"}}
        container_env += [{"name": "CUDA_VISIBLE_DEVICES", "valueFrom": ref},
                          {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": ref}]
    elif need.gib > 0:  # a CPU replica: its need is its memory request and limit: an overrun is its OOMKill alone
        mem = f"{math.ceil(need.gib * 1024)}Mi"
        resources["requests"]["memory"] = resources["limits"]["memory"] = mem
    if not resources["limits"]:
        del resources["limits"]
    http = {"port": "http"}
    container = {
        "name": "engine", "image": opts.image, "imagePullPolicy": opts.image_pull_policy,
        "args": engine_args(model, checkpoint, args, opts.port),
        "ports": [{"name": "http", "containerPort": opts.port, "protocol": "TCP"}],
        "env": container_env, "resources": resources,
        "readinessProbe": {"httpGet": {"path": "/ready", **http}, "periodSeconds": 2, "failureThreshold": 2},
        "startupProbe": {"httpGet": {"path": "/health", **http}, "periodSeconds": 5,
                         "failureThreshold": max(1, int(opts.start_timeout_s // 5))},
        "livenessProbe": {"httpGet": {"path": "/health", **http}, "periodSeconds": 10, "failureThreshold": 6},
        "lifecycle": {"preStop": {"exec": {"command": [
            "/opt/argosy/bin/python", "-m", "argosy.fleet.drain_hook", "--port", str(opts.port),
            "--timeout", str(opts.drain_s)]}}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": list(opts.volume_mounts),
    }
    spec: dict = {"containers": [container], "restartPolicy": "Never",
                  "terminationGracePeriodSeconds": opts.termination_grace_s,
                  "nodeSelector": dict(opts.node_selector), "tolerations": list(opts.tolerations),
                  "volumes": list(opts.volumes), "enableServiceLinks": False}
    if opts.service_account:
        spec["serviceAccountName"] = opts.service_account
    if opts.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in opts.image_pull_secrets]
    if opts.scheduler_name:
        spec["schedulerName"] = opts.scheduler_name
    elif placement is not None and not placement.node.startswith("local"):
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [placement.node]}]}]}}}
    meta: dict = {"name": name, "labels": labels, "annotations": annotations}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def leader_worker_set(pod: dict, placement: Placement | None, stages: int) -> dict:
    """A replica whose pipeline stages span nodes: one LeaderWorkerSet group of `stages` pods (the LWS
    takes the pod's name), each rank under torchrun (rank 0, the leader, serves HTTP; docs/parallel.md).
    Labels `argosy.dev/group` (the LWS's name) and `argosy.dev/role` (leader, worker) find the group's
    pods; an anti-affinity keeps them on nodes of their own, pinned (without `scheduler_name`) to the
    nodes the placer chose. A worker has no probes nor preStop: the leader's say for the group."""
    name, meta = pod["metadata"]["name"], pod["metadata"]
    apart = {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {f"{LABEL}/group": name}}, "topologyKey": "kubernetes.io/hostname"}]}

    def rank_pod(role: str, nodes: list[str], gpus: tuple[int, ...] | None) -> dict:
        spec = {k: v for k, v in pod["spec"].items() if k != "affinity"}
        spec["affinity"] = {"podAntiAffinity": apart}
        if "affinity" in pod["spec"] and nodes:  # pinned: the placer chose the nodes
            spec["affinity"]["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": nodes}]}]}}
        c = dict(spec["containers"][0])
        rdzv = "$(LWS_LEADER_ADDRESS):29500"
        c["command"] = ["/usr/bin/tini", "--", "/opt/argosy/bin/python", "-m", "torch.distributed.run",
                        f"--nnodes={stages}", "--nproc-per-node=1", "--node-rank=$(LWS_WORKER_INDEX)",
                        "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv}", "-m", "argosy.cli"]
        if role == "worker":
            for probe in ("readinessProbe", "startupProbe", "livenessProbe", "lifecycle"):
                c.pop(probe, None)
        spec["containers"] = [c]
        labels = {**meta["labels"], f"{LABEL}/group": name, f"{LABEL}/role": role}
        annotations = dict(meta["annotations"])
        if gpus is not None and f"{LABEL}/gpus" in annotations:  # shares GPUs by memory: the stage's own
            annotations[f"{LABEL}/gpus"] = ",".join(map(str, gpus))
        return {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}

    parts = placement.parts() if placement is not None else []
    leader = rank_pod("leader", [n for n, _ in parts[:1]], None)
    # One template for every worker: each gets the first worker stage's GPU indices (exact for two stages).
    worker = rank_pod("worker", [n for n, _ in parts[1:]], parts[1][1] if len(parts) > 1 else None)
    lws_meta = {**meta, "labels": {**meta["labels"], f"{LABEL}/group": name}}
    return {"apiVersion": f"{LWS_GROUP}/{LWS_VERSION}", "kind": "LeaderWorkerSet", "metadata": lws_meta,
            "spec": {"replicas": 1, "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": {
                "size": stages, "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader, "workerTemplate": worker}}}


def quantity_gib(q: str | None) -> float:
    """A Kubernetes memory quantity ("16Gi", "16000Mi", "17179869184", "16G") in GiB."""
    if not q:
        return 0.0
    units = {"Ki": 1024, "Mi": 1024 ** 2, "Gi": GIB, "Ti": 1024 ** 4, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    for suffix, mult in units.items():
        if q.endswith(suffix):
            return float(q[:-len(suffix)]) * mult / GIB
    return float(q) / GIB


def node_from_k8s(obj: dict, opts: KubernetesProviderOptions) -> Node:
    """A placer Node from a Kubernetes Node: its GPUs (count from the device plugin's allocatable, memory
    per GPU from the GPU-feature-discovery label in MiB; unknown memory: whole GPUs) and its memory."""
    meta, status = obj.get("metadata", {}), obj.get("status", {})
    labels = meta.get("labels") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    count = int(float(alloc.get(opts.gpu_resource, 0) or 0))
    mib = labels.get(opts.gpu_memory_label)
    per_gpu = float(mib) / 1024 if mib else 1e6
    product = labels.get(opts.gpu_product_label, "GPU")
    gpus = [GPU(i, product, per_gpu) for i in range(count)]
    return Node(meta["name"], "kubernetes", gpus, quantity_gib(alloc.get("memory")) or float("inf"))


def node_ready(obj: dict) -> bool:
    if (obj.get("spec") or {}).get("unschedulable"):
        return False
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def lost_node(pod: dict, k8s_nodes: dict[str, dict]) -> str | None:
    """Why the pod's node is down ("node X is gone"/"NotReady"), None while it is up or not yet chosen."""
    node = (pod.get("spec") or {}).get("nodeName")
    if node and (node not in k8s_nodes or not node_ready(k8s_nodes[node])):
        return f"node {node} is {'gone' if node not in k8s_nodes else 'NotReady'}"
    return None


def pod_ready(obj: dict) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def pod_failure(obj: dict) -> str | None:
    """Why a replica pod has ended (None while it runs or waits): phase, container exit and message."""
    status = obj.get("status") or {}
    phase = status.get("phase")
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return (f"container {cs.get('name')} terminated: {term.get('reason') or 'Error'} "
                    f"(exit {term.get('exitCode')}) {term.get('message') or ''}").strip()
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerError",
                                     "CreateContainerConfigError"):
            return f"container {cs.get('name')}: {waiting['reason']}: {waiting.get('message', '')}".strip()
    if phase in ("Failed", "Succeeded"):
        return f"pod {phase}: {status.get('reason', '')} {status.get('message', '')}".strip()
    return None


def is_out_of_memory(detail: str) -> bool:
    low = detail.lower()
    return any(m in low for m in OOM_MARKERS)
