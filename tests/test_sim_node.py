"""Replicas sharing a CPU node: the node's CPU outside the engines, measured and simulated."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time

import pytest

from argosy.sim.results import render_text
from tests.test_sim import constant_profile, simulate

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads Linux's /proc")


def tpot_p50(spec: dict, profile, **settings) -> float:
    return simulate(spec, profile=profile, **settings)[1]["tpot_s"]["p50"]


def test_token_cpu_outside_the_engine_slows_a_shared_nodes_steps():
    # One replica on a one-core node, 10 ms steps, one request at a time: alone a token takes 10 ms. If each
    # token also costs the node 5 ms of CPU elsewhere (gateway, event loop), the step asks for 1.5 cores of
    # the one: 15 ms. Without --node-cores the figures are not read.
    spec = {"duration_s": 120, "rate": 0.5, "prompt_tokens": {"mean": 16}, "output_tokens": {"mean": 10}}
    prof = dataclasses.replace(constant_profile(0.010), node_token_cpu_table=((1.0, 0.005),))
    assert tpot_p50(spec, constant_profile(0.010), replicas=1, node_cores=1.0) == pytest.approx(0.010)
    assert tpot_p50(spec, prof, replicas=1, node_cores=1.0) == pytest.approx(0.015)
    assert tpot_p50(spec, prof, replicas=1) == pytest.approx(0.010)


def test_a_step_beside_busy_neighbours_reads_its_weights_again():
    # Two replicas kept busy on a one-core node, 10 ms steps: each gets half the core, 20 ms a token. A
    # step after a neighbour stepped costs 4 ms more (the profile's neighbour table), but only when the
    # replica was off its core since (half the time here): (10 + 0.5 x 4) x 2 = 24 ms. One replica alone
    # on the node, or replicas on their own hardware, pay nothing.
    spec = {"duration_s": 60, "rate": 40, "prompt_tokens": {"mean": 16}, "output_tokens": {"mean": 30}}
    prof = dataclasses.replace(constant_profile(0.010), neighbour_step_table=((1.0, 0.004),))
    assert tpot_p50(spec, constant_profile(0.010), replicas=2, node_cores=1.0) == pytest.approx(0.020)
    assert tpot_p50(spec, prof, replicas=2, node_cores=1.0) == pytest.approx(0.024)
    assert tpot_p50(spec, prof, replicas=2) == pytest.approx(0.010)
    assert tpot_p50({**spec, "rate": 0.5}, prof, replicas=1, node_cores=1.0) == pytest.approx(0.010)


def test_a_shared_core_is_lost_in_whole_slices_around_the_same_mean():
    # Two replicas kept busy on a one-core node, 10 ms steps: a step takes 20 ms on average either way.
    # Stretched evenly (no time slice in the profile), every token takes exactly 20 ms. The kernel instead
    # runs a thread at full speed and then another for a slice: a step is its 10 ms plus whole 5 ms slices
    # lost, Poisson-many, so tokens spread around the same mean and queues see the spread.
    spec = {"duration_s": 60, "rate": 40, "prompt_tokens": {"mean": 16}, "output_tokens": {"mean": 30}}
    import numpy as np

    from argosy.sim.results import latencies

    def tpot_ttft(profile, spec):
        sim, res = simulate(spec, profile=profile, replicas=2 if spec["rate"] > 1 else 1, node_cores=1.0)
        ttft, tpot, _ = latencies(sim, sim.done)
        return np.percentile(tpot, [1, 99]), tpot.mean(), res["ttft_s"]

    sliced_prof = dataclasses.replace(constant_profile(0.010), time_slice_s=0.005)
    (lo, hi), _, even_ttft = tpot_ttft(constant_profile(0.010), spec)
    assert lo == pytest.approx(0.020) and hi == pytest.approx(0.020)
    (lo, hi), mean, sliced_ttft = tpot_ttft(sliced_prof, spec)
    assert mean == pytest.approx(0.020, rel=0.03)
    assert lo < 0.019 and hi > 0.021
    assert sliced_ttft["p99"] > even_ttft["p99"] + 0.005
    # On a node with a core to spare nothing is lost, sliced or not.
    (lo, hi), _, _ = tpot_ttft(sliced_prof, {**spec, "rate": 0.5})
    assert lo == pytest.approx(0.010) and hi == pytest.approx(0.010)
    # And a run is reproducible: the slices lost are drawn from a seeded generator.
    assert tpot_ttft(sliced_prof, spec)[2] == sliced_ttft


def test_the_time_slice_is_read_from_steps_timed_alone_and_beside_busy_threads():
    # Synthetic steps as this machine's look: 2 ms alone (0.3 ms of noise); beside busy threads each loses
    # Poisson(0.5)-many 4 ms slices. The stretched steps give the slice back; steps that were not stretched
    # (a node with cores to spare) give 0.
    import numpy as np

    from argosy.sim.measure import slice_from_steps

    rng = np.random.default_rng(3)
    alone = 0.002 + rng.normal(0, 3e-4, 600)
    shared = 0.002 + rng.normal(0, 3e-4, 300) + 0.004 * rng.poisson(0.5, 300)
    assert slice_from_steps(alone, shared) == pytest.approx(0.004, rel=0.1)
    assert slice_from_steps(alone, 0.002 + rng.normal(0, 3e-4, 300)) == 0.0
    # A few stalls (a page fault, another VM on the host) are not read as the slice.
    stalled = shared.copy()
    stalled[::60] += 0.050
    assert slice_from_steps(alone, stalled) == pytest.approx(0.004, rel=0.1)


def test_a_requests_serving_overhead_waits_for_a_core_on_a_busy_node():
    # What serving adds to a request (HTTP, tokenization, first chunk: 20 ms, measured on an idle node) is a
    # thread's work beside the busy engines: two replicas kept busy on one core leave it a third of the
    # core, 60 ms. On an idle node, or on its own hardware, it stays 20 ms. The engines' steps are not
    # touched (the same TPOT).
    busy = {"duration_s": 60, "rate": 40, "prompt_tokens": {"mean": 16}, "output_tokens": {"mean": 30}}
    idle = {**busy, "rate": 0.5}
    plain = constant_profile(0.010)
    served = dataclasses.replace(plain, request_s=0.020)

    def ttft_p50(spec, profile, **settings):
        return simulate(spec, profile=profile, **settings)[1]["ttft_s"]["p50"]

    for spec, settings, factor in ((busy, {"replicas": 2, "node_cores": 1.0}, 3.0),
                                   (idle, {"replicas": 1, "node_cores": 1.0}, 1.0),
                                   (busy, {"replicas": 2}, 1.0)):
        added = ttft_p50(spec, served, **settings) - ttft_p50(spec, plain, **settings)
        assert added == pytest.approx(0.020 * factor, rel=0.02), settings
    assert tpot_p50(busy, served, replicas=2, node_cores=1.0) == pytest.approx(0.020)


def test_a_packed_nodes_cpu_ledger_counts_the_steps_run_and_never_exceeds_its_cores():
    # Three replicas of 8 sequences flooded on a two-core node, 10 ms steps, 1 ms of node CPU per token
    # outside the engines. Arrivals keep cutting decode runs short: only the steps a run got through are
    # CPU spent, so the outside CPU is exactly 1 ms x the tokens made, and the node spends its two cores
    # over the run, never more (counting whole runs, cut or not, made it 3.0 cores here).
    spec = {"duration_s": 20, "rate": 40, "prompt_tokens": {"mean": 16}, "output_tokens": {"mean": 40}}
    prof = dataclasses.replace(constant_profile(0.010), node_token_cpu_table=((1.0, 0.001),))
    model = {"engine": {"max_num_seqs": 8}}
    sim, res = simulate(spec, model=model, profile=prof, replicas=3, node_cores=2.0)
    cpu = res["node_cpu_s"]
    assert res["requests"]["failed"] == 0
    assert cpu["outside"] == pytest.approx(0.001 * res["output_tokens"], rel=1e-6)
    span = max(r.finish_s for r in sim.done)
    spent = cpu["engines"] + cpu["outside"] + cpu["starts"]
    assert 0.95 * 2.0 * span < spent <= 2.0 * span * (1 + 1e-9)
    assert "node CPU (2 cores)" in render_text(res)
    assert simulate(spec, model=model, profile=prof, replicas=3)[1]["node_cpu_s"] is None  # not a shared node


def test_the_node_cpu_grows_with_the_replicas_at_work_against_the_one_it_was_measured_beside():
    prof = dataclasses.replace(constant_profile(), node_neighbour_table=((3.0, 1.5), (1.0, 1.1), (2.0, 1.3)))
    assert prof.node_cpu_scale(0) == prof.node_cpu_scale(1) == 1.0
    assert prof.node_cpu_scale(2) == pytest.approx(1.3 / 1.1)
    assert prof.node_cpu_scale(9) == pytest.approx(1.5 / 1.1)  # flat beyond the measured neighbours
    noisy = dataclasses.replace(prof, node_neighbour_table=((1.0, 1.2), (2.0, 1.1)))
    assert noisy.node_cpu_scale(2) == 1.0  # never below what was measured beside one
    with pytest.raises(ValueError, match="node_neighbour_table"):
        dataclasses.replace(prof, node_neighbour_table=((1.0, 0.0),))
    # Three replicas flooded on two cores, 1 ms of node CPU a token measured beside one at work: beside
    # three it is 1.5 ms (all but the run-up and the drain), and the tokens come slower. One replica
    # alone, or no table, stays at 1 ms.
    spec = {"duration_s": 20, "rate": 40, "prompt_tokens": {"mean": 16}, "output_tokens": {"mean": 40}}
    base = dataclasses.replace(constant_profile(0.010), node_token_cpu_table=((1.0, 0.001),))
    scaled = dataclasses.replace(base, node_neighbour_table=((1.0, 1.0), (3.0, 1.5)))
    model = {"engine": {"max_num_seqs": 8}}

    def run(profile, replicas):
        res = simulate(spec, model=model, profile=profile, replicas=replicas, node_cores=2.0)[1]
        return res["node_cpu_s"]["outside"] / (0.001 * res["output_tokens"]), res["tpot_s"]["p50"]

    (plain, tpot_plain), (packed, tpot_packed) = run(base, 3), run(scaled, 3)
    assert plain == pytest.approx(1.0) and 1.4 < packed <= 1.5
    assert tpot_packed > tpot_plain * 1.05
    assert run(scaled, 1)[0] == pytest.approx(1.0)


def test_the_neighbour_table_is_read_by_neighbours_at_work():
    prof = dataclasses.replace(constant_profile(), neighbour_step_table=((3.0, 0.003), (1.0, 0.001)))
    assert prof.neighbour_step_table[0] == (1.0, 0.001)  # sorted
    assert prof.neighbour_step_s(0) == 0.0
    assert prof.neighbour_step_s(1) == pytest.approx(0.001)
    assert prof.neighbour_step_s(2) == pytest.approx(0.002)
    assert prof.neighbour_step_s(7) == pytest.approx(0.003)  # flat beyond the measured neighbours
    with pytest.raises(ValueError, match="node CPU"):
        dataclasses.replace(prof, neighbour_step_table=((1.0, -0.001),))


@pytest.mark.parametrize("table", [[[1]], [[1, 0.001, 5]], [["a", 0.001]], [[1, None]], "x", [[True, 0.001]]])
@pytest.mark.parametrize("name", ["neighbour_step_table", "node_token_cpu_table", "serving_table",
                                  "node_neighbour_table"])
def test_a_hand_edited_profile_table_is_refused_by_name(tmp_path, name, table):
    # A profile file is JSON a person may edit: a row that is not an [x, y] pair of numbers was a bare
    # unpacking error in the middle of `argosy sim --node-cores` (exit 1, a traceback).
    from argosy.sim.profile import load_profile

    path = tmp_path / "p.json"
    data = {**dataclasses.asdict(constant_profile()), name: table}
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"not a valid profile: {name} must be a list of"):
        load_profile(path)


def test_the_neighbour_sweep_streams_the_models_weight_bytes(tmp_path, monkeypatch):
    # The sweep streams n times the engine's weight bytes between steps: the model's own size, not a guess.
    from argosy.engine.config import EngineConfig
    from argosy.engine.llm_engine import LLMEngine
    from argosy.engine.random_model import make_random_model
    from argosy.sim import measure

    ckpt = tmp_path / "tiny"
    make_random_model(ckpt, size="tiny", vocab_size=512)
    engine = LLMEngine(EngineConfig(model=str(ckpt), device="cpu", max_num_seqs=4, max_num_batched_tokens=64,
                                    kv_cache_memory_gib=0.05))
    try:
        size = measure._weight_bytes(engine)
        from safetensors import safe_open

        with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
            stored = sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys())
        assert size >= stored * 0.9  # every weight counted (tied or derived buffers may add a little)
        sizes, real_buffer = [], measure._neighbour_buffer
        monkeypatch.setattr(measure, "_neighbour_buffer", lambda nbytes: sizes.append(nbytes) or real_buffer(nbytes))
        table = measure._neighbour_sweep(engine, measure._Prober(engine), 2, 1)
        assert sizes == [n * size for n in (1, 2, 3)]
        sizes.clear()
        ratios = measure._node_neighbour_sweep(engine, 1)  # the serving path's, beside the same buffers
    finally:
        engine.close()
    assert [n for n, _ in table] == [1.0, 2.0, 3.0] and all(t >= 0 for _, t in table)
    assert sizes == [n * size for n in (1, 2, 3)]
    assert [n for n, _ in ratios] == [1.0, 2.0, 3.0] and all(0.5 < r < 10 for _, r in ratios)
    assert real_buffer(1 << 40).nbytes == measure.NEIGHBOUR_CAP_BYTES  # a huge model is not copied three times


def test_node_cpu_is_read_by_streams_and_per_request():
    prof = dataclasses.replace(constant_profile(), node_token_cpu_table=((16.0, 0.001), (1.0, 0.004)),
                               node_request_cpu_s=0.002)
    assert prof.node_token_cpu_table[0] == (1.0, 0.004)  # sorted
    assert prof.node_cpu_s(1, 10, 0) == pytest.approx(0.040)
    assert prof.node_cpu_s(64, 10, 2) == pytest.approx(0.010 + 0.004)  # flat beyond the measured streams
    assert prof.node_cpu_s(8, 1, 0) == pytest.approx(0.004 - 7 / 15 * 0.003)
    with pytest.raises(ValueError, match="node CPU"):
        dataclasses.replace(prof, node_request_cpu_s=-1.0)


def test_a_start_on_a_busy_shared_node_takes_longer_than_alone():
    # A spike makes the autoscaler start replicas while the first one is busy. On its own hardware a start
    # takes the profile's cold_start_s; sharing a one-core node with a busy replica, at most half a core.
    spec = {"duration_s": 60, "rate": 60, "prompt_tokens": {"mean": 64}, "output_tokens": {"mean": 40}}
    model = {"autoscaling": {"min_replicas": 1, "max_replicas": 3, "target": 2, "tick_s": 1}}
    prof = constant_profile(0.010, cold_start_s=5.0)
    alone, _ = simulate(spec, model, prof)
    shared, _ = simulate(spec, model, prof, node_cores=1.0)
    under_load, _ = simulate(spec, model, dataclasses.replace(prof, cold_start_cpu_s=8.0), node_cores=1.0)

    def starts(sim):
        return [r.ready_s - r.started_s for r in sim.all_replicas[1:]]

    assert starts(alone) and all(d == pytest.approx(5.0) for d in starts(alone))
    assert starts(shared)[0] >= 9.5  # one core for the busy replica's engine and the start: half each
    assert starts(under_load)[0] > starts(shared)[0] * 1.4  # paced by the CPU it took beside a serving replica


def _spin(seconds: float, hold: threading.Event | None = None) -> None:
    from argosy.server.async_engine import _name_os_thread

    _name_os_thread("argosy-engine")
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    if hold is not None:
        hold.wait()  # a thread's /proc entry goes when it ends


def test_the_engine_thread_is_named_for_the_os_and_left_out_of_the_serving_cpu():
    from argosy.sim.measure_node import serving_cpu_s, thread_cpu_s

    hold = threading.Event()
    t = threading.Thread(target=_spin, args=(0.4, hold))
    serving0, total0, engines0 = serving_cpu_s(os.getpid()), time.process_time(), thread_cpu_s(os.getpid())[0]
    t.start()
    while t.native_id is None:
        time.sleep(0.001)
    time.sleep(0.05)
    with open(f"/proc/self/task/{t.native_id}/comm") as f:
        assert f.read().strip() == "argosy-engine"
    while time.process_time() - total0 < 0.4:
        time.sleep(0.01)
    assert serving_cpu_s(os.getpid()) - serving0 < 0.15  # the spinning thread's CPU is not the serving CPU
    assert thread_cpu_s(os.getpid())[0] - engines0 >= 0.35  # but the engines'
    hold.set()
    t.join()


def test_the_node_is_kept_busy_by_idle_priority_spinners_only_while_measured():
    import os

    from argosy.sim.measure_node import _tree, cores_kept_busy

    def spinners() -> list[int]:
        return [pid for pid in _tree(os.getpid())[1:] if os.sched_getscheduler(pid) == os.SCHED_IDLE]

    with cores_kept_busy():
        deadline = time.monotonic() + 10
        while len(spinners()) < len(os.sched_getaffinity(0)) and time.monotonic() < deadline:
            time.sleep(0.05)  # each sets its own policy as it starts
        found = spinners()
        assert len(found) == len(os.sched_getaffinity(0))  # one a core, at idle priority
        busy = sum(int(open(f"/proc/{pid}/stat").read().split(")")[1].split()[11]) for pid in found)
        time.sleep(0.5)
        assert sum(int(open(f"/proc/{pid}/stat").read().split(")")[1].split()[11]) for pid in found) > busy
    assert not any(os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] != "Z"
                   for pid in found)  # gone with the measurement


def test_spinners_end_with_a_profile_that_was_killed():
    # A killed `argosy profile` had left its spinners taking every core for ever (SIGKILL runs no finally).
    import signal
    import subprocess
    import sys

    from argosy.sim.measure_node import _tree

    code = ("import time\nfrom argosy.sim.measure_node import spinning_on_every_core\n"
            "with spinning_on_every_core(idle_priority=False):\n    time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while len(_tree(parent.pid)) < 1 + len(os.sched_getaffinity(0)) and time.monotonic() < deadline:
            time.sleep(0.05)
        spinners = _tree(parent.pid)[1:]
        assert len(spinners) == len(os.sched_getaffinity(0))
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()

    def running(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 5
    while any(running(pid) for pid in spinners) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(running(pid) for pid in spinners)


def test_a_cpu_watch_keeps_what_a_thread_spent_before_it_ended():
    # A replica the autoscaler stops mid-run takes its threads out of /proc: what they spent up to the last
    # look still counts, as an engine's or not.
    from argosy.sim.measure_node import CpuWatch

    watch, hold, total0 = CpuWatch(os.getpid()), threading.Event(), time.process_time()
    t = threading.Thread(target=_spin, args=(0.3, hold))
    t.start()
    while time.process_time() - total0 < 0.3:
        time.sleep(0.01)
    watch.look()
    hold.set()
    t.join()
    watch.look()  # the thread is gone
    spent = watch.spent()
    assert spent["engines"] >= 0.25
    assert spent["outside"] < 0.15


def test_measure_node_behind_a_real_gateway(tmp_path):
    from argosy.engine.random_model import make_random_model
    from argosy.sim.measure_node import measure_node

    ckpt = tmp_path / "tiny"
    make_random_model(ckpt, size="tiny", vocab_size=512)
    prof = measure_node(str(ckpt), constant_profile(), max_num_seqs=4, token_budget=64, kv_cache_memory_gib=0.05,
                        prompt_tokens=16, output_tokens=32, requests=32, rounds=2, log=lambda m: None)
    assert [s for s, _ in prof.node_token_cpu_table] == [1.0, 4.0]  # the streams up to max_num_seqs
    assert all(cpu >= 0 for _, cpu in prof.node_token_cpu_table)
    # A token behind a gateway costs tens to hundreds of microseconds of Python, not nothing or a second.
    assert 1e-5 < prof.node_token_cpu_table[0][1] < 0.05
    assert prof.cold_start_cpu_s > 0.5  # a start takes seconds of CPU (imports, load, warm-up)
    assert prof.notes["node"]["start_cpu_s"] == prof.cold_start_cpu_s
    # Each level was run `rounds` times in turn; the table holds the median round (of two: the higher).
    rounds = prof.notes["node"]["rounds"]
    assert sorted(rounds) == ["1", "4", "short"] and all(len(v) == 2 for v in rounds.values())
    cpu, tokens = sorted(rounds["4"])[1]
    assert prof.node_token_cpu_table[1][1] == pytest.approx(max(cpu - prof.node_request_cpu_s, 0) / tokens)


def test_profile_node_is_for_a_generating_model_on_this_machine(capsys):
    from argosy.cli import main

    assert main(["profile", "--gpu", "H100", "--model-config", "llama-3.1-8b", "--node"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--node measures a generating model" in err[0]


def test_measure_node_names_why_serve_did_not_start(tmp_path):
    from argosy.sim.measure_node import measure_node

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="argosy serve did not start: .*no checkpoint"):
        measure_node(str(tmp_path / "missing"), constant_profile(), max_num_seqs=4, token_budget=64,
                     kv_cache_memory_gib=0.05, log=lambda m: None)
    assert time.monotonic() - t0 < 60  # at once, not after the readiness timeout
    with pytest.raises(ValueError, match="output_tokens"):
        measure_node(str(tmp_path / "missing"), constant_profile(), max_num_seqs=4, token_budget=64,
                     kv_cache_memory_gib=0.05, output_tokens=8, log=lambda m: None)


def test_the_neighbour_sweep_is_not_moved_by_the_host_drifting_under_it(monkeypatch):
    # A host that slows steadily (2 us a step) under a sweep whose neighbours cost every step 0.5 ms: each
    # cycle reads its first step against the same cycle's recovered steps, so the drift stays out of the term
    # (timed in blocks, alone then after 1, 2 and 3 neighbours, it read 0.46, 0.50 and 0.54 ms here).
    import torch

    from argosy.sim import measure

    class DriftingProbe:
        calls, cold = 0, False

        def decoding(self, batch, context):
            pass

        def clear(self):
            pass

        def timed_step(self):
            self.calls += 1
            cost, self.cold = 0.001 + 2e-6 * self.calls + (0.0005 if self.cold else 0.0), False
            return cost

    probe = DriftingProbe()

    class Neighbours:  # reading it leaves the next step cold
        def sum(self):
            probe.cold = True

    class Engine:
        class runner:
            model = torch.nn.Linear(64, 64)

    monkeypatch.setattr(measure, "_neighbour_buffer", lambda nbytes: Neighbours())
    table = measure._neighbour_sweep(Engine(), probe, 4, 3)
    assert [n for n, _ in table] == [1.0, 2.0, 3.0]
    assert all(t == pytest.approx(0.0005, abs=3e-5) for _, t in table), table
