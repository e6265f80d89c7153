"""A replica across nodes on Kubernetes: one LeaderWorkerSet (kubernetes_pods.leader_worker_set),
created and deleted through the official client's CustomObjectsApi. The LWS controller makes the
group's pods; they carry the replica's labels, so the provider's pod watch sees them, and what they
say decides how the replica stands: the leader's address is its URL, and any pod of the group that
fails, a leader that goes away (or comes back as another pod), or a node of the group that goes down,
ends it (the controller then deletes the LWS and starts another, as for a pod).
"""

from __future__ import annotations

from argosy.fleet import kubernetes_pods as pods

GROUP, ROLE = f"{pods.LABEL}/group", f"{pods.LABEL}/role"
NOT_INSTALLED = ("LeaderWorkerSet is not installed in this cluster (no {group}/{version} {plural}): install it "
                 "(https://lws.sigs.k8s.io/docs/installation/) to run a model with pipeline_across_nodes")


class LeaderWorkerSets:
    """Creates and deletes LeaderWorkerSets in one namespace (blocking calls: run them in a thread)."""

    def __init__(self, api_client, namespace: str):
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.live: set[str] = set()  # created here and not deleted yet

    def create(self, manifest: dict) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.create_namespaced_custom_object(pods.LWS_GROUP, pods.LWS_VERSION, self.namespace,
                                                        pods.LWS_PLURAL, manifest)
        except ApiException as e:
            if e.status == 404:
                raise RuntimeError(NOT_INSTALLED.format(group=pods.LWS_GROUP, version=pods.LWS_VERSION,
                                                        plural=pods.LWS_PLURAL)) from None
            raise
        self.live.add(manifest["metadata"]["name"])

    def delete(self, name: str, request_timeout: float | None = None) -> None:
        """Delete the LWS (404: already gone); Kubernetes deletes its pods, each with its grace period and
        preStop (drain)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(pods.LWS_GROUP, pods.LWS_VERSION, self.namespace,
                                                        pods.LWS_PLURAL, name, propagation_policy="Background",
                                                        _request_timeout=request_timeout)
        except ApiException as e:
            if e.status != 404:
                raise
        self.live.discard(name)


def members(cache: dict[str, dict], group: str) -> dict[str, dict]:
    """The group's pods in the provider's cache (pod name -> object)."""
    return {n: o for n, o in cache.items() if ((o.get("metadata") or {}).get("labels") or {}).get(GROUP) == group}


def leader(cache: dict[str, dict], group: str) -> tuple[str, dict] | None:
    for name, o in members(cache, group).items():
        if o["metadata"]["labels"].get(ROLE) == "leader":
            return name, o
    return None


def identity(o: dict) -> str:
    """Which pod this is: its uid (a recreated leader has the same name, not the same uid), else its name."""
    meta = o.get("metadata") or {}
    return meta.get("uid") or meta["name"]


def failure(cache: dict[str, dict], group: str) -> str | None:
    """The first pod of the group that has failed, and why (None while none has)."""
    for name, o in sorted(members(cache, group).items()):
        why = pods.pod_failure(o)
        if why:
            return f"pod {name} of leaderworkerset {group}: {why}"
    return None


def ended(cache: dict[str, dict], k8s_nodes: dict[str, dict], group: str, leader_seen: str | None) -> str | None:
    """Why the group's replica is over (None while it runs); `leader_seen`: identity() of the leader it
    started with (None while it starts: only a failure ends it then)."""
    why = failure(cache, group)
    if why or leader_seen is None:
        return why
    found = leader(cache, group)
    if found is None or identity(found[1]) != leader_seen:
        return f"leader pod of leaderworkerset {group} {'deleted' if found is None else 'recreated'}"
    for name, o in sorted(members(cache, group).items()):
        lost = pods.lost_node(o, k8s_nodes)
        if lost:
            return f"pod {name} of leaderworkerset {group}: {lost}"
    return None
