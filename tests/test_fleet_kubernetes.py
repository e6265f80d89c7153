"""The kubernetes provider against kmock's emulator with the official client; the test plays the
kubelet: scale up (pods with GPU requests, probes, preStop, owner), scale down (graceful delete),
a pod that fails (out of memory: estimate corrected, another GPU first), a node that goes away."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytest.importorskip("kmock", reason="the test extra brings kmock (pip install -e '.[test]')")

from argosy.fleet.controller import make_provider  # noqa: E402
from argosy.fleet.placement import Need, OutOfMemoryAtLoad, Placer  # noqa: E402
from argosy.fleet.replica import Replica, ReplicaSpec  # noqa: E402
from tests.kube_fixtures import KubeEmulator  # noqa: E402


@pytest.fixture
def kube():
    k = KubeEmulator()
    yield k
    k.close()


def provider(kube: KubeEmulator, **extra):
    return make_provider("kubernetes", {"kubeconfig": kube.kubeconfig, "owner_pod": "argosy-controller",
                                        "resync_s": 0.3, "image": "localhost/argosy-cpu:test", **extra})


class Kubelet:
    """Runs each new replica pod on the node its affinity names, with a loopback IP of its own."""

    def __init__(self, kube: KubeEmulator):
        self.kube, self.ips, self.stop = kube, {}, threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.stop.is_set():
            try:
                pods = self.kube.pods()
            except Exception:  # the emulator is gone: the test is over
                return
            for p in pods:
                name = p["metadata"]["name"]
                if name in self.ips:
                    continue
                terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                node = terms["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
                self.ips[name] = f"127.0.0.{len(self.ips) + 2}"
                self.kube.run_pod(name, self.ips[name], node)
            time.sleep(0.05)


def replica(model: str, placer: Placer, need: Need, provider_name: str = "kubernetes") -> Replica:
    r = Replica(model, ReplicaSpec(model, "/models/" + model, ["--dtype", "bfloat16"]))
    r.spec.placement = placer.place(r.id, model, need, provider_name)
    return r


def test_scale_up_makes_pods_with_gpus_probes_drain_hook_and_owner(kube):
    uid = kube.add_controller_pod()
    kube.add_node("gpu-a", gpus=2, gpu_mib=81559)
    kube.add_node("gpu-b", gpus=1, gpu_mib=81559)
    kubelet = Kubelet(kube)

    async def scenario():
        p = provider(kube)
        nodes = await p.nodes()
        assert {n.name: [g.memory_gib for g in n.gpus] for n in nodes} == {
            "gpu-a": [pytest.approx(79.65, abs=0.01)] * 2, "gpu-b": [pytest.approx(79.65, abs=0.01)]}
        placer = Placer(nodes)
        whole = [replica("big", placer, Need(1, float("inf"))) for _ in range(2)]
        shared = replica("small", placer, Need(1, 30.0))
        await asyncio.wait_for(asyncio.gather(*(p.start(r) for r in [*whole, shared])), 20)
        assert all(p.alive(r) for r in [*whole, shared])
        assert {r.node for r in whole} == {"gpu-a", "gpu-b"}  # spread over nodes
        pods = {x["metadata"]["labels"]["argosy.dev/replica"]: x for x in kube.pods()}
        await p.close()  # deletes what is left of its own
        assert kube.pods() == []
        return whole, shared, pods

    whole, shared, pods = asyncio.run(scenario())
    kubelet.stop.set()
    assert len(pods) == 3
    for r in [*whole, shared]:
        assert r.url == f"http://{kubelet.ips[r.handle]}:8000"
    big = pods[whole[0].id]["spec"]
    c = big["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert "argosy.fleet.drain_hook" in c["lifecycle"]["preStop"]["exec"]["command"]
    assert c["args"][:3] == ["engine", "--model", "/models/big"] and "--port" in c["args"]
    owner = pods[whole[0].id]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", "argosy-controller", uid)
    # The replica sharing a GPU by memory asks the device plugin for none; its GPU comes from the annotation.
    small = pods[shared.id]
    assert "nvidia.com/gpu" not in small["spec"]["containers"][0]["resources"].get("limits", {})
    assert small["metadata"]["annotations"]["argosy.dev/gpus"] == ",".join(map(str, shared.spec.placement.gpus))
    env = {e["name"]: e for e in small["spec"]["containers"][0]["env"]}
    assert "argosy.dev/gpus" in env["CUDA_VISIBLE_DEVICES"]["valueFrom"]["fieldRef"]["fieldPath"]


def test_scale_down_deletes_the_pod_and_waits_until_it_is_gone(kube):
    kube.add_controller_pod()
    kube.add_node("cpu-a", memory="32Gi")
    kubelet = Kubelet(kube)

    async def scenario():
        p = provider(kube)
        placer = Placer(await p.nodes())
        keep, go = replica("m", placer, Need(0, 2.0)), replica("m", placer, Need(0, 2.0))
        await asyncio.gather(p.start(keep), p.start(go))
        pod = kube.pods()[0]["spec"]["containers"][0]
        assert pod["resources"]["limits"]["memory"] == "2048Mi"  # a CPU replica: its need is its limit
        waiter = asyncio.create_task(p.wait(go))
        await p.stop(go, timeout=10)
        assert go.handle not in {x["metadata"]["name"] for x in kube.pods()}
        await asyncio.wait_for(waiter, 5)  # the replica's wait ends with its pod
        assert "deleted" in go.detail
        assert p.alive(keep) and not p.alive(go)
        await p.close()

    asyncio.run(scenario())
    kubelet.stop.set()


def test_a_pod_that_fails_ends_its_replica_and_out_of_memory_corrects_the_estimate(kube):
    kube.add_controller_pod()
    kube.add_node("gpu-a", gpus=2, gpu_mib=40960)
    kubelet = Kubelet(kube)

    async def scenario():
        p = provider(kube)
        placer = Placer(await p.nodes())
        crash, oom = replica("a", placer, Need(1, 10.0)), replica("b", placer, Need(1, 30.0))
        await asyncio.gather(p.start(crash), p.start(oom))
        kube.fail_pod(crash.handle, "Error", "segfault", 139)
        await asyncio.wait_for(p.wait(crash), 5)
        assert "exit 139" in crash.detail and not p.alive(crash)
        kube.fail_pod(oom.handle, "Error", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
        with pytest.raises(OutOfMemoryAtLoad) as e:
            await asyncio.wait_for(p.wait(oom), 5)
        assert e.value.corrected.gib == pytest.approx(37.5)
        failed_gpu = oom.spec.placement.gpus[0]
        placer.release(oom.id)
        placer.note_oom("b", e.value.placement)
        again = placer.place("r-again", "b", Need(1, 10.0), "kubernetes")
        assert again.gpus != (failed_gpu,)  # another GPU first
        await p.close()

    asyncio.run(scenario())
    kubelet.stop.set()


def test_a_node_that_goes_away_ends_its_replicas_and_is_not_placed_on(kube):
    kube.add_controller_pod()
    for name in ("gpu-a", "gpu-b"):
        kube.add_node(name, gpus=1, gpu_mib=81559)
    kubelet = Kubelet(kube)

    async def scenario():
        p = provider(kube)
        placer = Placer(await p.nodes())
        ra, rb = replica("m", placer, Need(1, 20.0)), replica("m", placer, Need(1, 20.0))
        await asyncio.gather(p.start(ra), p.start(rb))
        lost, kept = (ra, rb) if ra.node == "gpu-a" else (rb, ra)
        assert p.down_nodes() == set()
        kube.set_node_ready("gpu-a", False)
        await asyncio.wait_for(p.wait(lost), 5)
        assert "NotReady" in lost.detail and p.down_nodes() == {"gpu-a"}
        kube.delete_node("gpu-a")
        await asyncio.sleep(1.0)
        assert p.down_nodes() == {"gpu-a"} and p.alive(kept)
        placer.release(lost.id)
        assert placer.place("r-new", "m", Need(1, 20.0), "kubernetes", p.down_nodes()).node == "gpu-b"
        await p.close()

    asyncio.run(scenario())
    kubelet.stop.set()


def test_only_the_lease_holder_starts_replicas(kube):
    kube.add_controller_pod()
    kube.add_node("cpu-a")

    async def scenario():
        first = provider(kube, leader_election=True, lease_duration_s=2, owner_pod="argosy-controller")
        second = provider(kube, leader_election=True, lease_duration_s=2, owner_pod="argosy-controller")
        second.identity = "argosy-controller-2"
        await first.nodes()
        await asyncio.wait_for(first.lease.wait_leader(), 5)
        await second.nodes()
        await asyncio.sleep(1.0)
        assert not second.lease.leader.is_set()
        await first.close()  # stops renewing: the lease expires and the other takes over
        await asyncio.wait_for(second.lease.wait_leader(), 8)
        await second.close()

    asyncio.run(scenario())
