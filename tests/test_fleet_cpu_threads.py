"""CPU replicas on one machine share its cores: the usable cores (affinity and cgroup quota), the fleet's
share per replica, the flag it passes, the engine keeping to it, and `argosy serve` doing all of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from argosy.config import parse_fleet
from argosy.engine.host_cores import cgroup_cpu_quota, usable_cores
from argosy.fleet.local import cpu_threads_each


def _proc(tmp: Path, *lines: str) -> str:
    proc = tmp / "proc-self"
    proc.mkdir()
    (proc / "cgroup").write_text("\n".join(lines) + "\n")
    return str(proc)


def _write(path: Path, name: str, text: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / name).write_text(text)


def test_a_cgroup_v2_quota_and_its_ancestors_bound_the_usable_cores(tmp_path):
    root = tmp_path / "cgroup"
    _write(root / "pods" / "pod1", "cpu.max", "150000 100000\n")  # 1.5 CPUs
    _write(root / "pods", "cpu.max", "max 100000\n")
    proc = _proc(tmp_path, "0::/pods/pod1")
    assert cgroup_cpu_quota(proc, str(root)) == pytest.approx(1.5)
    assert usable_cores(proc, str(root)) == min(len(os.sched_getaffinity(0)), 2)  # 1.5 keeps two threads busy
    _write(root / "pods", "cpu.max", "100000 100000\n")  # an ancestor's lower limit wins
    assert cgroup_cpu_quota(proc, str(root)) == pytest.approx(1.0)
    assert usable_cores(proc, str(root)) == 1


def test_no_quota_leaves_the_affinity_and_v1_quotas_count_too(tmp_path):
    root = tmp_path / "cgroup"
    _write(root, "cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(_proc(tmp_path, "0::/"), str(root)) is None
    assert usable_cores(str(tmp_path / "proc-self"), str(root)) == len(os.sched_getaffinity(0))
    v1 = tmp_path / "v1"
    _write(v1 / "cpu,cpuacct" / "docker" / "c1", "cpu.cfs_quota_us", "300000\n")
    _write(v1 / "cpu,cpuacct" / "docker" / "c1", "cpu.cfs_period_us", "100000\n")
    (tmp_path / "proc-self" / "cgroup").write_text("4:memory:/docker/c1\n3:cpu,cpuacct:/docker/c1\n0::/\n")
    assert cgroup_cpu_quota(str(tmp_path / "proc-self"), str(v1)) == pytest.approx(3.0)
    (v1 / "cpu,cpuacct" / "docker" / "c1" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(str(tmp_path / "proc-self"), str(v1)) is None
    (tmp_path / "proc-self" / "cgroup").write_text("garbage\n")
    assert cgroup_cpu_quota(str(tmp_path / "proc-self"), str(v1)) is None


def _fleet(*models: dict):
    return parse_fleet({"providers": {"local": {}, "ray": {}}, "models": list(models)}).models


def test_the_fleet_shares_the_cores_among_the_cpu_replicas_it_may_run_here(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    three = {"name": "a", "checkpoint": "builtin", "autoscaling": {"min_replicas": 1, "max_replicas": 3}}
    assert cpu_threads_each(_fleet(three), gpus_here=False, cores=2) == 1  # never below one
    assert cpu_threads_each(_fleet(three), gpus_here=False, cores=16) == 5
    pooled = {**three, "name": "b", "autoscaling": {"max_replicas": 2, "warm_pool": 1}}
    assert cpu_threads_each(_fleet(three, pooled), gpus_here=False, cores=16) == 2  # 3 + 2 + 1 slots
    on_cpu, on_gpu = {**three, "engine": {"device": "cpu"}}, {**three, "name": "c", "engine": {"device": "cuda"}}
    assert cpu_threads_each(_fleet(on_cpu, on_gpu), gpus_here=True, cores=16) == 5  # only the CPU model counts
    assert cpu_threads_each(_fleet(three), gpus_here=True, cores=16) is None  # device auto goes to the GPUs
    assert cpu_threads_each(_fleet({**three, "provider": "ray"}), gpus_here=False, cores=16) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the operator's choice, for every replica
    assert cpu_threads_each(_fleet(three), gpus_here=False, cores=16) is None


def test_a_cpu_replica_is_started_with_its_share_unless_the_fleet_file_sets_it():
    from prometheus_client import CollectorRegistry

    from argosy.fleet.metrics import FleetMetrics
    from argosy.fleet.placement import Need, Placer
    from argosy.fleet.replica_set import ReplicaSet

    def args(model: dict, need: Need, threads: int | None) -> list[str]:
        m = _fleet(model)[0]
        rs = ReplicaSet(m, None, None, None, Placer([]), need, FleetMetrics(CollectorRegistry()), cpu_threads=threads)
        return rs.replica_args(rs.stable, need)

    plain = {"name": "a", "checkpoint": "builtin"}
    got = args(plain, Need.of(0, 1.0), 2)
    assert got[got.index("--cpu-threads") + 1] == "2"
    assert "--cpu-threads" not in args(plain, Need.of(1, 1.0), 2)  # a GPU replica
    assert "--cpu-threads" not in args(plain, Need.of(0, 1.0), None)  # OMP_NUM_THREADS set, or not local
    own = args({**plain, "engine": {"cpu_threads": 3}}, Need.of(0, 1.0), 2)
    assert own.count("--cpu-threads") == 1 and own[own.index("--cpu-threads") + 1] == "3"


def test_the_engine_runs_its_kernels_on_cpu_threads(tiny_llama):
    from argosy.engine.config import EngineConfig
    from argosy.engine.model_runner import ModelRunner

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        ModelRunner(EngineConfig(model=tiny_llama, device="cpu", kv_cache_memory_gib=0.01, cpu_threads=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="cpu_threads"):
        EngineConfig(model=tiny_llama, cpu_threads=0)


@pytest.mark.timeout(180)
def test_argosy_serve_gives_each_cpu_replica_its_share_of_the_cores(tmp_path):
    from argosy.engine.random_model import make_random_model
    from tests.fleet_fixtures import Serve, engine_pids, ready, tiny_fleet

    ckpt = str(make_random_model(tmp_path / "tiny", init_std=0.2))
    serve = Serve(tiny_fleet(ckpt, min_replicas=2, max_replicas=2), omp_threads=None)
    try:
        serve.wait_for("two ready replicas", lambda st: len(ready(st)) == 2)
        want = str(max(1, usable_cores() // 2))
        shares = []
        for pid in engine_pids(ckpt):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            shares.append(cmd[cmd.index("--cpu-threads") + 1] if "--cpu-threads" in cmd else None)
        assert shares == [want, want], shares
        assert any(f"run their kernels on {want} thread" in line for line in serve.lines), serve.lines[-20:]
    finally:
        serve.stop()


def test_more_threads_than_usable_cores_are_run_but_named(caplog):
    from argosy.engine.platforms.cpu import CpuPlatform

    before = torch.get_num_threads()
    try:
        with caplog.at_level("WARNING", logger="argosy.engine"):
            CpuPlatform().use_threads(usable_cores() + 1)
        assert torch.get_num_threads() == usable_cores() + 1
        assert "exceeds the" in caplog.text and "take turns" in caplog.text
    finally:
        torch.set_num_threads(before)
