"""The Kubernetes provider: each replica is a Pod (kubernetes_pods.py says what it holds), or, for a
model with `pipeline_across_nodes`, a LeaderWorkerSet group (kubernetes_groups.py), created and watched
through the official `kubernetes` client.

A ClusterWatch (kubernetes_watch.py) keeps what the cluster says of this controller's pods and the
Nodes; every change wakes the waiters here. A replica ends (`wait`
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

from argosy.config_providers import KubernetesProviderOptions
from argosy.fleet import kubernetes_groups as groups
from argosy.fleet import kubernetes_pods as pods
from argosy.fleet.kubernetes_watch import ClusterWatch
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
        self.cluster = ClusterWatch(self.opts, self.namespace, self.selector)
        self.listed: dict[str, Node] = {}  # fleet-file nodes of this provider
        self.owner: dict | None = None
        self.lease = None
        self.connecting = asyncio.Lock()
        self.lws: groups.LeaderWorkerSets | None = None
        self.leaders: dict[str, str] = {}  # LWS name -> identity of the leader pod its replica started with

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

        loop = asyncio.get_running_loop()
        self.api_client = await asyncio.to_thread(make_api_client, self.opts)
        self.core = client.CoreV1Api(self.api_client)
        self.lws = groups.LeaderWorkerSets(self.api_client, self.namespace)
        self.owner = await asyncio.to_thread(self._owner_reference)
        await asyncio.to_thread(self.cluster.start, self.core, loop)
        if self.opts.leader_election:
            from argosy.fleet.kubernetes_lease import LeaseElector

            self.lease = LeaseElector(self.api_client, self.namespace, self.opts.lease_name, self.identity,
                                      self.opts.lease_duration_s)
            self.lease.start(loop)

    def _owner_reference(self) -> dict | None:
        """The controller's own Pod, so Kubernetes deletes the replicas with it (None outside a pod)."""
        name = self.opts.owner_pod or os.environ.get("POD_NAME")
        if not name:
            log.warning("fleet: kubernetes: no owner pod (POD_NAME unset): replicas are deleted on stop only")
            return None
        obj = json.loads(self.core.read_namespaced_pod(name, self.namespace, _preload_content=False).data)
        return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": obj["metadata"]["uid"],
                "controller": True, "blockOwnerDeletion": True}

    # ------------------------------------------------------------------ nodes

    async def nodes(self) -> list[Node]:
        await self._connect()
        return [pods.node_from_k8s(o, self.opts) for o in self.cluster.k8s_nodes.values() if pods.node_ready(o)]

    async def bind(self, listed: list[Node]) -> None:
        await self._connect()
        self.listed = {n.name: n for n in listed}
        for name in self.listed:
            if name not in self.cluster.k8s_nodes:
                log.warning("fleet: kubernetes: node %s: no such Node in the cluster; no replica is placed there",
                            name)

    def down_nodes(self) -> set[str]:
        """Nodes not to place on: gone, NotReady or cordoned (and listed ones the cluster lacks)."""
        known = set(self.listed) | self.cluster.seen_nodes
        return {n for n in known if n not in self.cluster.k8s_nodes or not pods.node_ready(self.cluster.k8s_nodes[n])}

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
        if r.spec.stages > 1:
            await self._start_group(r, manifest)
            return
        await asyncio.to_thread(self.core.create_namespaced_pod, self.namespace, manifest)
        log.info("fleet: kubernetes: %s: pod %s created", r.id, name)

        def running() -> bool:
            o = self.cluster.pods.get(name)
            return o is None or pods.pod_failure(o) is not None or self._running(o)

        await asyncio.sleep(0)
        if not await self.cluster.until(lambda: name in self.cluster.pods or self.cluster.closing.is_set(), 30.0):
            raise RuntimeError(f"pod {name} did not appear in the watch within 30 s")
        if not await self.cluster.until(running, self.opts.start_timeout_s):
            raise RuntimeError(f"pod {name} not running after {self.opts.start_timeout_s:g} s: "
                               f"{self._pending_reason(name)}")
        self._raise_if_ended(r)
        ip = self.cluster.pods[name]["status"]["podIP"]
        r.url = f"http://{ip}:{self.opts.port}"
        r.detail = f"pod {name} on {self.cluster.pods[name]['spec'].get('nodeName', '?')}"

    @staticmethod
    def _running(o: dict) -> bool:
        return bool((o.get("status") or {}).get("podIP") and (o.get("status") or {}).get("phase") == "Running")

    async def _start_group(self, r: Replica, pod: dict) -> None:
        """Create the replica's LeaderWorkerSet and wait until its leader pod runs with an IP (the URL);
        raises RuntimeError if a pod of the group fails first or the leader is not running in time."""
        name = r.handle
        # Forget the leaders of groups that are gone (a waiter of theirs saw them go when their pods did).
        self.leaders = {g: i for g, i in self.leaders.items()
                        if g in self.lws.live or groups.members(self.cluster.pods, g)}
        await asyncio.to_thread(self.lws.create, pods.leader_worker_set(pod, r.spec.placement, r.spec.stages))
        log.info("fleet: kubernetes: %s: leaderworkerset %s (%d pods) created", r.id, name, r.spec.stages)

        def running() -> bool:
            found = groups.leader(self.cluster.pods, name)
            return self.cluster.closing.is_set() or groups.failure(self.cluster.pods, name) is not None or (
                found is not None and self._running(found[1]))

        if not await self.cluster.until(running, self.opts.start_timeout_s):
            found = groups.leader(self.cluster.pods, name)
            raise RuntimeError(f"leaderworkerset {name}: leader not running after {self.opts.start_timeout_s:g} s: "
                               f"{self._pending_reason(found[0]) if found else 'no leader pod'}")
        self._raise_if_ended(r)
        leader_name, leader = groups.leader(self.cluster.pods, name)
        self.leaders[name] = groups.identity(leader)
        r.url = f"http://{leader['status']['podIP']}:{self.opts.port}"
        r.detail = (f"leaderworkerset {name}: {r.spec.stages} pods, leader {leader_name} on "
                    f"{leader['spec'].get('nodeName', '?')}")

    def _pending_reason(self, name: str) -> str:
        o = self.cluster.pods.get(name) or {}
        conds = (o.get("status") or {}).get("conditions") or []
        why = [f"{c.get('reason', '')}: {c.get('message', '')}" for c in conds if c.get("status") == "False"]
        return "; ".join(why) or (o.get("status") or {}).get("phase", "gone")

    def ended(self, r: Replica) -> str | None:
        """Why the replica is over (None while its pod runs on a live node)."""
        if r.handle is not None and r.spec.stages > 1:
            return groups.ended(self.cluster.pods, self.cluster.k8s_nodes, r.handle, self.leaders.get(r.handle))
        o = self.cluster.pods.get(r.handle) if r.handle else None
        if o is None:
            return f"pod {r.handle} deleted"
        return pods.pod_failure(o) or pods.lost_node(o, self.cluster.k8s_nodes)

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
        return r.handle is not None and self.ended(r) is None and (r.spec.stages == 1 or r.handle in self.leaders)

    async def wait(self, r: Replica) -> None:
        """Returns when the replica's pod has ended, was deleted or lost its node (r.detail says which);
        raises OutOfMemoryAtLoad when it ran out of memory (seams.ReplicaProvider)."""
        await self.cluster.until(lambda: self.ended(r) is not None or self.cluster.closing.is_set(), float("inf"))
        if self.cluster.closing.is_set():
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
        if r.spec.stages > 1:  # the group goes with its LWS: each pod's preStop drains, the leader's matters
            await asyncio.to_thread(self.lws.delete, r.handle)
            await self.cluster.until(lambda: not groups.members(self.cluster.pods, r.handle), timeout)
            return
        from kubernetes.client.exceptions import ApiException

        try:
            await asyncio.to_thread(self.core.delete_namespaced_pod, r.handle, self.namespace,
                                    grace_period_seconds=self.opts.termination_grace_s)
        except ApiException as e:
            if e.status != 404:
                raise
        await self.cluster.until(lambda: r.handle not in self.cluster.pods, timeout)

    def kill_now(self, r: Replica) -> None:
        """Interpreter exit: delete the pod at once (no grace)."""
        if r.handle is not None and self.core is not None:
            with contextlib.suppress(Exception):
                if r.spec.stages > 1:
                    self.lws.delete(r.handle, request_timeout=5)
                    return
                self.core.delete_namespaced_pod(r.handle, self.namespace, grace_period_seconds=0,
                                                _request_timeout=5)

    async def close(self) -> None:
        self.cluster.closing.set()  # waiters return now; the threads are joined below
        self.cluster.wake()
        if self.lease is not None:
            await self.lease.stop()
        if self.core is not None:  # anything of ours still there (the controller drained what it knew)
            for name in list(self.lws.live):
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.lws.delete, name)
            for name, o in list(self.cluster.pods.items()):
                if groups.GROUP in ((o.get("metadata") or {}).get("labels") or {}):
                    continue  # the LWS's: deleting it alone would have the LWS make it again
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.core.delete_namespaced_pod, name, self.namespace,
                                            grace_period_seconds=self.opts.termination_grace_s)
            await asyncio.to_thread(self.api_client.close)
        await self.cluster.stop()
