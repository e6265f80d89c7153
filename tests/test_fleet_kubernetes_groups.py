"""A replica across nodes (`pipeline_across_nodes`) on the kubernetes provider: one LeaderWorkerSet,
against kmock's emulator with the official client; the test plays the LWS controller and the kubelet
(it makes each group's pods from the LWS's templates and runs them). Scale up makes one LWS of the
right size and resources; scale down drains the replica and deletes its LWS; a worker pod that fails
ends the replica, and the controller replaces the group."""

from __future__ import annotations

import asyncio
import http.server
import threading

import pytest

pytest.importorskip("kmock", reason="the test extra brings kmock (pip install -e '.[test]')")

from argosy.config import parse_fleet  # noqa: E402
from argosy.fleet.controller import Controller, make_provider  # noqa: E402
from argosy.fleet.placement import Need, Placer, Unplaceable  # noqa: E402
from argosy.fleet.replica import Replica, ReplicaSpec  # noqa: E402
from argosy.gateway.app import Gateway  # noqa: E402
from argosy.models.builtin import BUILTIN_MODEL_DIR  # noqa: E402
from tests.kube_fixtures import KubeEmulator, LwsController  # noqa: E402
from tests.test_fleet_kubernetes_controller import Replica as ReplicaHandler  # noqa: E402
from tests.test_fleet_kubernetes_controller import free_port, until  # noqa: E402

WHOLE = float("inf")


@pytest.fixture
def kube():
    k = KubeEmulator()
    yield k
    k.close()


def provider(kube: KubeEmulator):
    return make_provider("kubernetes", {"kubeconfig": kube.kubeconfig, "owner_pod": "argosy-controller",
                                        "resync_s": 0.3, "image": "localhost/argosy-cpu:test"})


def group_replica(placer: Placer, need: Need, stages: int = 2) -> Replica:
    r = Replica("big", ReplicaSpec("big", "/models/big", ["-tp", "2", "-pp", str(stages)], stages=stages))
    r.spec.placement = placer.place_stages(r.id, "big", need, stages, "kubernetes")
    return r


def node_of(template: dict) -> list[str]:
    terms = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return terms["nodeSelectorTerms"][0]["matchFields"][0]["values"]


def test_scale_up_makes_one_leader_worker_set_with_a_stage_on_each_node(kube):
    uid = kube.add_controller_pod()
    kube.add_node("gpu-a", gpus=2, gpu_mib=81559)
    kube.add_node("gpu-b", gpus=2, gpu_mib=81559)
    kube.add_node("gpu-c", gpus=1, gpu_mib=81559)
    lws = LwsController(kube)

    async def scenario():
        p = provider(kube)
        placer = Placer(await p.nodes())
        with pytest.raises(Unplaceable):  # tensor 2 x pipeline 2: no node has 4 GPUs
            placer.place("one-node", "big", Need(4, WHOLE), "kubernetes")
        r = group_replica(placer, Need(4, WHOLE))
        await asyncio.wait_for(p.start(r), 20)
        assert p.alive(r)
        sets, pods = kube.leader_worker_sets(), kube.pods()
        assert not placer.nodes["gpu-c"].gpus[0].used_gib  # the stages took gpu-a and gpu-b
        await p.close()  # deletes its LWS; the LWS controller takes the pods
        await until("the group's pods gone", lambda: not kube.pods())
        assert kube.leader_worker_sets() == []
        return r, sets, pods

    r, sets, pods = asyncio.run(scenario())
    lws.close()
    assert len(sets) == 1 and len(pods) == 2  # one LWS, and no Pod of the provider's own beside its group
    obj = sets[0]
    assert obj["metadata"]["name"] == r.handle
    owner = obj["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", "argosy-controller", uid)
    tpl = obj["spec"]["leaderWorkerTemplate"]
    assert tpl["size"] == 2
    leader, worker = tpl["leaderTemplate"], tpl["workerTemplate"]
    for t in (leader, worker):
        c = t["spec"]["containers"][0]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"  # tensor_parallel_size GPUs per stage
        assert "--nnodes=2" in c["command"] and c["args"][:3] == ["engine", "--model", "/models/big"]
        anti = t["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert anti["labelSelector"]["matchLabels"] == {"argosy.dev/group": r.handle}
    assert leader["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert "readinessProbe" not in worker["spec"]["containers"][0]
    assert {*node_of(leader), *node_of(worker)} == {"gpu-a", "gpu-b"} and node_of(leader) == [r.node]
    assert r.url == f"http://{lws.ips[r.handle + '-0']}:8000"  # the leader's address


def test_stages_that_share_gpus_by_memory_each_name_their_own():
    from argosy.config_providers import KubernetesProviderOptions
    from argosy.fleet import kubernetes_pods as pods
    from argosy.fleet.placement import Placement

    p = Placement("gpu-a", (1,), Need(1, 30.0), (("gpu-b", (0,)),))
    pod = pods.replica_pod("argosy-m-r1-abcd", "r1", "m", "/models/m", [], {}, p, KubernetesProviderOptions(),
                           "ctl", None)
    tpl = pods.leader_worker_set(pod, p, 2)["spec"]["leaderWorkerTemplate"]
    leader, worker = tpl["leaderTemplate"], tpl["workerTemplate"]
    assert leader["metadata"]["annotations"]["argosy.dev/gpus"] == "1"
    assert worker["metadata"]["annotations"]["argosy.dev/gpus"] == "0"
    assert "nvidia.com/gpu" not in worker["spec"]["containers"][0]["resources"].get("limits", {})
    assert (node_of(leader), node_of(worker)) == (["gpu-a"], ["gpu-b"])


def test_a_cluster_without_leaderworkerset_fails_the_replica_with_one_line():
    def no_lws(emu) -> None:  # the API server's answer when the CRD is not installed
        emu["post /apis/leaderworkerset.x-k8s.io/v1/namespaces/default/leaderworkersets"] << 404

    kube = KubeEmulator(no_lws)
    kube.add_controller_pod()
    for name in ("gpu-a", "gpu-b"):
        kube.add_node(name, gpus=1, gpu_mib=81559)

    async def scenario():
        p = provider(kube)
        r = group_replica(Placer(await p.nodes()), Need(2, WHOLE))
        with pytest.raises(RuntimeError, match="LeaderWorkerSet is not installed in this cluster"):
            await asyncio.wait_for(p.start(r), 10)
        await p.close()

    try:
        asyncio.run(scenario())
    finally:
        kube.close()


def test_stop_deletes_the_leader_worker_set_and_waits_for_its_pods(kube):
    kube.add_controller_pod()
    for name in ("cpu-a", "cpu-b"):
        kube.add_node(name, memory="32Gi")
    lws = LwsController(kube)

    async def scenario():
        p = provider(kube)
        placer = Placer(await p.nodes())
        keep, go = group_replica(placer, Need(0, 2.0)), group_replica(placer, Need(0, 2.0))
        await asyncio.gather(p.start(keep), p.start(go))
        assert len(kube.leader_worker_sets()) == 2 and len(kube.pods()) == 4
        waiter = asyncio.create_task(p.wait(go))
        await p.stop(go, timeout=10)
        assert {o["metadata"]["name"] for o in kube.leader_worker_sets()} == {keep.handle}
        assert {x["metadata"]["name"] for x in kube.pods()} == {keep.handle + "-0", keep.handle + "-0-1"}
        await asyncio.wait_for(waiter, 5)  # the replica's wait ends with its group
        assert "deleted" in go.detail
        assert p.alive(keep) and not p.alive(go)
        await p.close()

    asyncio.run(scenario())
    lws.close()


def test_a_worker_pod_that_fails_ends_the_groups_replica(kube):
    kube.add_controller_pod()
    for name in ("gpu-a", "gpu-b"):
        kube.add_node(name, gpus=1, gpu_mib=81559)
    lws = LwsController(kube)

    async def scenario():
        p = provider(kube)
        placer = Placer(await p.nodes())
        r = group_replica(placer, Need(2, WHOLE))
        await p.start(r)
        kube.fail_pod(r.handle + "-0-1", "Error", "NCCL error: remote process exited", 1)
        await asyncio.wait_for(p.wait(r), 5)
        assert not p.alive(r)
        assert f"pod {r.handle}-0-1" in r.detail and "exit 1" in r.detail
        await p.stop(r, timeout=5)  # what the controller does with a failed replica
        assert kube.leader_worker_sets() == []
        await p.close()

    asyncio.run(scenario())
    lws.close()


def test_the_controller_replaces_a_failed_group_and_drains_one_on_scale_down():
    kube = KubeEmulator()
    kube.add_controller_pod()
    for name in ("cpu-a", "cpu-b"):
        kube.add_node(name, memory="16Gi")
    port, servers = free_port(), []

    def serve(ip: str) -> None:
        srv = http.server.ThreadingHTTPServer((ip, port), ReplicaHandler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)

    lws = LwsController(kube, serve)
    fleet = parse_fleet({
        "gateway": {"port": 0, "health_interval_s": 0.5},
        "providers": {"kubernetes": {"kubeconfig": kube.kubeconfig, "owner_pod": "argosy-controller",
                                     "resync_s": 0.3, "port": port}},
        "models": [{"name": "tiny", "checkpoint": str(BUILTIN_MODEL_DIR), "provider": "kubernetes",
                    "pipeline_across_nodes": True,
                    "engine": {"kv_cache_memory_gib": 0.05, "device": "cpu", "pipeline_parallel_size": 2},
                    "autoscaling": {"min_replicas": 2, "max_replicas": 2, "tick_s": 0.2, "restart_backoff_s": 0.2,
                                    "drain_timeout_s": 2}}]})
    routed_at_delete: dict[str, set[str]] = {}

    async def scenario():
        gw = Gateway(fleet)
        await gw.startup()
        ctl = Controller(fleet, gw)
        await ctl.start()
        mc = ctl.models["tiny"]
        ready = lambda: [r for r in mc.status()["replicas"] if r["state"] == "ready"]  # noqa: E731
        routed = lambda: {u.url for u in gw.models["tiny"].upstreams()}  # noqa: E731
        try:
            first = await until("two ready groups", lambda: len(ready()) == 2 and ready())
            assert len(kube.leader_worker_sets()) == 2 and len(kube.pods()) == 4
            assert routed() == {r["url"] for r in first}
            assert {f"http://{lws.ips[name + '-0']}:{port}" for name in lws.groups} == routed()  # leaders' URLs

            # A worker pod that fails: reported, its LWS deleted, another group made and ready.
            victim = next(r for r in mc.replicas.values() if r.state == "ready")
            kube.fail_pod(victim.handle + "-0-1", "Error", "NCCL error", 1)
            await until("the failure reported", lambda: mc.status()["recent_failures"])
            failure = mc.status()["recent_failures"][0]
            assert failure["id"] == victim.id and f"{victim.handle}-0-1" in failure["detail"]
            await until("the failed group's LWS deleted", lambda: victim.handle in lws.deleted)
            await until("a replacement", lambda: len(ready()) == 2 and victim.id not in {r["id"] for r in ready()})
            assert len(kube.leader_worker_sets()) == 2

            # Scale down: the replica leaves the routing set (drained), then its LWS is deleted.
            mc.task.cancel()  # hold the loop so the desired count does not start it again
            lws.on_delete = lambda name: routed_at_delete.setdefault(name, routed())
            before = {o["metadata"]["name"] for o in kube.leader_worker_sets()}
            mc.reconcile(1)
            await until("one replica", lambda: len(mc.replicas) == 1, 10)
            after = {o["metadata"]["name"] for o in kube.leader_worker_sets()}
            assert len(after) == 1 and after < before
            gone = (before - after).pop()
            await until("its pods gone", lambda: gone in routed_at_delete and len(kube.pods()) == 2)
            assert f"http://{lws.ips[gone + '-0']}:{port}" not in routed_at_delete[gone]
        finally:
            await ctl.stop()
            await gw.shutdown()
        assert kube.leader_worker_sets() == []  # the controller's stop deleted what it ran

    try:
        asyncio.run(scenario())
    finally:
        lws.close()
        for srv in servers:
            srv.shutdown()
            srv.server_close()
        kube.close()
