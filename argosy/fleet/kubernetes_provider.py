"""The Kubernetes provider: each replica is a Pod (kubernetes_pods.py says what it holds), created and
watched through the official `kubernetes` client.

Two watch threads (Pods of this controller, Nodes), each re-listing every `resync_s` and after any
error, keep a cache the asyncio side reads; every change wakes the waiters. A replica ends (`wait`
returns, the controller replaces it) when its Pod fails, is deleted by anyone else, or its node goes
NotReady or away; a node that is down is also in `down_nodes`, so the placer puts the replacement
elsewhere. A replica that fails at load with out-of-memory raises OutOfMemoryAtLoad: the controller
corrects its estimate and the placer tries another GPU first. With `leader_election`, only the holder
of the Lease starts replicas (the others wait in `start`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import threading
import time

from argosy.config import KubernetesProviderOptions
from argosy.fleet import kubernetes_pods as pods
from argosy.fleet.placement import Node, OutOfMemoryAtLoad, corrected_need
from argosy.fleet.replica import Replica

log = logging.getLogger("argosy.fleet")
SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def make_api_client(opts: KubernetesProviderOptions):
    """An ApiClient of its own (the process-wide default configuration is left alone)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    if opts.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(config_file=opts.kubeconfig, context=opts.context, client_configuration=cfg)
    return client.ApiClient(cfg)


class KubernetesProvider:
    """A ReplicaProvider (argosy.fleet.seams) on a Kubernetes cluster: each replica a Pod."""

    name = "kubernetes"

    def __init__(self, options: dict | None = None):
        self.opts = KubernetesProviderOptions.model_validate(options or {})
        self.api_client = None
        self.core = None
        self.namespace = self.opts.namespace or self._own_namespace()
        self.identity = self.opts.owner_pod or os.environ.get("POD_NAME") or f"argosy-{secrets.token_hex(4)}"
        self.selector = f"{pods.LABEL}/controller={pods.label_value(self.identity)}"
        self.pods: dict[str, dict] = {}  # pod name -> its last seen object (API JSON)
        self.k8s_nodes: dict[str, dict] = {}
        self.seen_nodes: set[str] = set()  # every node ever listed: one that went away stays down
        self.listed: dict[str, Node] = {}  # fleet-file nodes of this provider
        self.owner: dict | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.changed = asyncio.Event()
        self.closing = threading.Event()
        self.threads: list[threading.Thread] = []
        self.lease = None
        self.connecting = asyncio.Lock()

    @staticmethod
    def _own_namespace() -> str:
        try:
            with open(SA_NAMESPACE) as f:
                return f.read().strip()
        except OSError:
            return "default"

    # ------------------------------------------------------------------ connection and watches

    async def _connect(self) -> None:
        async with self.connecting:  # several replicas may start at once: one client, one pair of watches
            if self.core is None:
                await self._connect_once()

    async def _connect_once(self) -> None:
        from kubernetes import client

        self.loop = asyncio.get_running_loop()
        self.api_client = await asyncio.to_thread(make_api_client, self.opts)
        self.core = client.CoreV1Api(self.api_client)
        self.owner = await asyncio.to_thread(self._owner_reference)
        for kind in ("pods", "nodes"):
            await asyncio.to_thread(self._relist, kind)
            t = threading.Thread(target=self._watch, args=(kind,), name=f"argosy-k8s-{kind}", daemon=True)
            t.start()
            self.threads.append(t)
        if self.opts.leader_election:
            from argosy.fleet.kubernetes_lease import LeaseElector

            self.lease = LeaseElector(self.api_client, self.namespace, self.opts.lease_name, self.identity,
                                      self.opts.lease_duration_s)
            self.lease.start(self.loop)

    def _owner_reference(self) -> dict | None:
        """The controller's own Pod, so Kubernetes deletes the replicas with it (None outside a pod)."""
        name = self.opts.owner_pod or os.environ.get("POD_NAME")
        if not name:
            log.warning("fleet: kubernetes: no owner pod (POD_NAME unset): replicas are deleted on stop only")
            return None
        obj = json.loads(self.core.read_namespaced_pod(name, self.namespace, _preload_content=False).data)
        return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": obj["metadata"]["uid"],
                "controller": True, "blockOwnerDeletion": True}

    def _relist(self, kind: str) -> str:
        if kind == "pods":
            data = json.loads(self.core.list_namespaced_pod(self.namespace, label_selector=self.selector,
                                                            _preload_content=False, _request_timeout=30).data)
            self.pods = {o["metadata"]["name"]: o for o in data.get("items", []) if self._ours(o)}
        else:
            data = json.loads(self.core.list_node(_preload_content=False, _request_timeout=30).data)
            self.k8s_nodes = {o["metadata"]["name"]: o for o in data.get("items", [])}
            self.seen_nodes |= set(self.k8s_nodes)
        self._notify()
        return (data.get("metadata") or {}).get("resourceVersion", "")

    def _watch(self, kind: str) -> None:
        from kubernetes import watch

        while not self.closing.is_set():
            try:
                version = self._relist(kind)
                if kind == "pods":
                    fn = self.core.list_namespaced_pod
                    kw = {"namespace": self.namespace, "label_selector": self.selector}
                else:
                    fn, kw = self.core.list_node, {}
                w = watch.Watch()
                # The server ends the stream after timeout_seconds; the read timeout covers one that does not.
                for ev in w.stream(fn, resource_version=version or None, _request_timeout=(10, self.opts.resync_s + 1),
                                   timeout_seconds=max(1, int(self.opts.resync_s)), **kw):
                    if self.closing.is_set():
                        w.stop()
                        break
                    self._apply(kind, ev["type"], ev["raw_object"])
            except Exception as e:  # the API went away, a 410 Gone, a reset: re-list and watch again
                if self._read_timeout(e):
                    continue
                if not self.closing.is_set():
                    log.warning("fleet: kubernetes: %s watch: %s; re-listing", kind, f"{type(e).__name__}: {e}"[:200])
                    self.closing.wait(1.0)

    @staticmethod
    def _read_timeout(e: Exception) -> bool:
        return "ReadTimeout" in type(e).__name__ or "timed out" in str(e)

    def _ours(self, pod: dict) -> bool:
        """The label selector, checked here too (a watch or list that ignored it must not mix controllers)."""
        key, value = self.selector.split("=", 1)
        return ((pod.get("metadata") or {}).get("labels") or {}).get(key) == value

    def _apply(self, kind: str, event: str, obj: dict) -> None:
        if kind == "pods" and not self._ours(obj):
            return
        table = self.pods if kind == "pods" else self.k8s_nodes
        name = obj["metadata"]["name"]
        if event == "DELETED":
            table.pop(name, None)
        elif event in ("ADDED", "MODIFIED"):
            table[name] = obj
            if kind == "nodes":
                self.seen_nodes.add(name)
        self._notify()

    def _notify(self) -> None:
        if self.loop is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        ev, self.changed = self.changed, asyncio.Event()
        ev.set()

    async def _until(self, cond, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not cond():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, self.opts.resync_s))
        return True

    # ------------------------------------------------------------------ nodes

    async def nodes(self) -> list[Node]:
        await self._connect()
        return [pods.node_from_k8s(o, self.opts) for o in self.k8s_nodes.values() if pods.node_ready(o)]

    async def bind(self, listed: list[Node]) -> None:
        await self._connect()
        self.listed = {n.name: n for n in listed}
        for name in self.listed:
            if name not in self.k8s_nodes:
                log.warning("fleet: kubernetes: node %s: no such Node in the cluster; no replica is placed there",
                            name)

    def down_nodes(self) -> set[str]:
        """Nodes not to place on: gone, NotReady or cordoned (and listed ones the cluster lacks)."""
        known = set(self.listed) | self.seen_nodes
        return {n for n in known if n not in self.k8s_nodes or not pods.node_ready(self.k8s_nodes[n])}

    # ------------------------------------------------------------------ replicas

    def _pod_name(self, r: Replica) -> str:
        return f"argosy-{pods.dns_label(r.model)}-{r.id}-{secrets.token_hex(2)}"

    async def start(self, r: Replica) -> None:
        """Create the replica's Pod and wait until it runs with an IP (sets r.url); raises RuntimeError
        (OutOfMemoryAtLoad for an out-of-memory death) if it ends first or is not running in time."""
        await self._connect()
        if self.lease is not None:
            await self.lease.wait_leader()
        name = self._pod_name(r)
        manifest = pods.replica_pod(name, r.id, r.model, r.spec.checkpoint, r.spec.engine_args, r.spec.env,
                                    r.spec.placement, self.opts, self.identity, self.owner)
        r.handle = name
        await asyncio.to_thread(self.core.create_namespaced_pod, self.namespace, manifest)
        log.info("fleet: kubernetes: %s: pod %s created", r.id, name)

        def running() -> bool:
            o = self.pods.get(name)
            return o is None or pods.pod_failure(o) is not None or bool(
                (o.get("status") or {}).get("podIP") and (o.get("status") or {}).get("phase") == "Running")

        await asyncio.sleep(0)
        if not await self._until(lambda: name in self.pods or self.closing.is_set(), 30.0):
            raise RuntimeError(f"pod {name} did not appear in the watch within 30 s")
        if not await self._until(running, self.opts.start_timeout_s):
            raise RuntimeError(f"pod {name} not running after {self.opts.start_timeout_s:g} s: "
                               f"{self._pending_reason(name)}")
        self._raise_if_ended(r)
        ip = self.pods[name]["status"]["podIP"]
        r.url = f"http://{ip}:{self.opts.port}"
        r.detail = f"pod {name} on {self.pods[name]['spec'].get('nodeName', '?')}"

    def _pending_reason(self, name: str) -> str:
        o = self.pods.get(name) or {}
        conds = (o.get("status") or {}).get("conditions") or []
        why = [f"{c.get('reason', '')}: {c.get('message', '')}" for c in conds if c.get("status") == "False"]
        return "; ".join(why) or (o.get("status") or {}).get("phase", "gone")

    def ended(self, r: Replica) -> str | None:
        """Why the replica is over (None while its pod runs on a live node)."""
        o = self.pods.get(r.handle) if r.handle else None
        if o is None:
            return f"pod {r.handle} deleted"
        failure = pods.pod_failure(o)
        if failure:
            return failure
        node = (o.get("spec") or {}).get("nodeName")
        if node and (node not in self.k8s_nodes or not pods.node_ready(self.k8s_nodes[node])):
            return f"node {node} is {'gone' if node not in self.k8s_nodes else 'NotReady'}"
        return None

    def _raise_if_ended(self, r: Replica) -> None:
        why = self.ended(r)
        if why is None:
            return
        r.detail = why
        p = r.spec.placement
        if p is not None and pods.is_out_of_memory(why):
            raise OutOfMemoryAtLoad(f"out of memory at load on {p.node} GPUs {list(p.gpus)}: {why}",
                                    p, corrected_need(p.need))
        raise RuntimeError(why)

    def alive(self, r: Replica) -> bool:
        return r.handle is not None and self.ended(r) is None

    async def wait(self, r: Replica) -> None:
        """Returns when the replica's pod has ended, was deleted or lost its node (r.detail says which);
        raises OutOfMemoryAtLoad when it ran out of memory (seams.ReplicaProvider)."""
        await self._until(lambda: self.ended(r) is not None or self.closing.is_set(), float("inf"))
        if self.closing.is_set():
            return
        try:
            self._raise_if_ended(r)
        except OutOfMemoryAtLoad:
            raise
        except RuntimeError:
            return  # an ordinary ending: r.detail says what it was

    async def stop(self, r: Replica, timeout: float = 10.0) -> None:
        """Delete the pod gracefully and wait up to `timeout` for it to go. No force after `timeout`: its
        preStop drains what other gateways sent it; Kubernetes kills it after termination_grace_s."""
        if r.handle is None or self.core is None:
            return
        from kubernetes.client.exceptions import ApiException

        try:
            await asyncio.to_thread(self.core.delete_namespaced_pod, r.handle, self.namespace,
                                    grace_period_seconds=self.opts.termination_grace_s)
        except ApiException as e:
            if e.status != 404:
                raise
        await self._until(lambda: r.handle not in self.pods, timeout)

    def kill_now(self, r: Replica) -> None:
        """Interpreter exit: delete the pod at once (no grace)."""
        if r.handle is not None and self.core is not None:
            with contextlib.suppress(Exception):
                self.core.delete_namespaced_pod(r.handle, self.namespace, grace_period_seconds=0,
                                                _request_timeout=5)

    async def close(self) -> None:
        self.closing.set()
        self._wake()
        if self.lease is not None:
            await self.lease.stop()
        if self.core is not None:  # anything of ours still there (the controller drained what it knew)
            for name in list(self.pods):
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.core.delete_namespaced_pod, name, self.namespace,
                                            grace_period_seconds=self.opts.termination_grace_s)
            await asyncio.to_thread(self.api_client.close)
        for t in self.threads:  # each leaves at its next event or read timeout (resync_s)
            await asyncio.to_thread(t.join, self.opts.resync_s + 2)
