"""Capacity planning that answers the operator: honest cost from a simulation (steady state, SLO stated or
refused, APIs of a comparable size), `argosy plan`'s answer and its JSON priced by `argosy cost --plan`,
and `argosy profile --gpu`'s capacity table."""

import json

import pytest

from argosy.cli import main


def _traffic(tmp_path, name="t.yaml", **over):
    spec = {"duration_s": 40, "rate": 20, "prompt_tokens": {"mean": 256}, "output_tokens": {"mean": 32}}
    spec.update(over)
    path = tmp_path / name
    path.write_text(json.dumps(spec))  # JSON is YAML
    return str(path)


def _fleet(tmp_path, **autoscaling):
    path = tmp_path / "fleet.yaml"
    path.write_text(json.dumps({"models": [{"name": "m", "autoscaling": {"tick_s": 1, **autoscaling}}]}))
    return str(path)


def _sim(tmp_path, capsys, argv, name="r.json"):
    out = tmp_path / name
    assert main(["sim", *argv, "--gpu", "H100", "--model-config", "llama-3.1-8b", "-o", str(out)]) == 0
    capsys.readouterr()
    return str(out), json.loads(out.read_text())


def test_sim_leaves_the_warm_up_out_of_the_priced_window(tmp_path, capsys):
    # An autoscaled fleet starting from one replica with a 10 s cold start: the run-up is in the whole run's
    # GPU-hours, not in the steady window that `argosy cost --sim` prices by default.
    fleet = _fleet(tmp_path, min_replicas=1, max_replicas=8, target=4, stable_window_s=4, panic_window_s=2)
    path, res = _sim(tmp_path, capsys, ["--config", fleet, "--traffic", _traffic(tmp_path, rate=40),
                                        "--cold-start", "10s"])
    st = res["steady"]
    assert st["from_s"] == 20.0  # the default: two cold starts with an autoscaler
    assert res["requests"]["measured_from_s"] == 20.0
    whole, steady = res["gpu_hours"]["H100"], st["gpu_hours"]["H100"]
    assert 0 < steady < whole
    assert 0 < st["gpu_busy_share"] <= 1 and 0 < st["token_time_split"]["input"] < 1
    assert main(["cost", "--sim", path, "--json", "--allow-slo-miss"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["window"].startswith("steady state 20-40 s")
    assert est["gpu_hours"] == pytest.approx(steady * 730 * 3600 / 20, rel=1e-3)
    assert main(["cost", "--sim", path, "--json", "--include-warmup", "--allow-slo-miss"]) == 0
    whole_est = json.loads(capsys.readouterr().out)
    assert whole_est["gpu_hours"] == pytest.approx(whole * 730 * 3600 / 40, rel=1e-3)


def test_cost_refuses_a_fleet_that_failed_its_slo_and_warns_when_asked(tmp_path, capsys):
    # One A100 replica against 40 req/s of 512-token prompts cannot meet a 200 ms TTFT.
    traffic = _traffic(tmp_path, rate=40, prompt_tokens={"mean": 512})
    out = tmp_path / "fail.json"
    assert main(["sim", "--traffic", traffic, "--gpu", "A100", "--model-config", "llama-3.1-8b", "--replicas", "1",
                 "--slo-ttft", "200ms", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["slo"]["met"] is False
    capsys.readouterr()
    assert main(["cost", "--sim", str(out)]) == 2
    err = capsys.readouterr().err
    assert "missed its SLO" in err and "--allow-slo-miss" in err and len(err.strip().splitlines()) == 1
    assert main(["cost", "--sim", str(out), "--allow-slo-miss"]) == 0
    text = capsys.readouterr().out
    assert "WARNING" in text and "NOT met" in text.split("Cost estimate")[0]


def test_cost_says_what_it_prices_and_compares_apis_of_a_comparable_size(tmp_path, capsys):
    path, res = _sim(tmp_path, capsys, ["--traffic", _traffic(tmp_path), "--replicas", "2"])
    assert res["slo"]["met"] and res["model"]["params"] == pytest.approx(8.03e9, rel=0.01)
    assert main(["cost", "--sim", path]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Pricing a fleet whose SLO attainment was 100.0% (target 90%): met.")
    assert "8B" in text and "70B" not in text and "70b" not in text  # only the 8B-class APIs of the shipped book
    assert main(["cost", "--sim", path, "--all-apis"]) == 0
    assert "Llama-3.3-70B" in capsys.readouterr().out


def test_plan_answers_per_region_and_its_json_feeds_cost(tmp_path, capsys):
    traffic = _traffic(tmp_path, rate=30, regions=[{"name": "us", "share": 3}, {"name": "eu", "share": 1}])
    out, html = tmp_path / "plan.json", tmp_path / "plan.html"
    assert main(["plan", "--traffic", traffic, "--model-config", "llama-3.1-8b", "--gpus", "H100,A100",
                 "--slo-ttft", "500ms", "-o", str(out), "--html", str(html)]) == 0
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    a = res["answer"]
    assert [r["region"] for r in a["regions"]] == ["us", "eu"]
    for r in a["regions"]:  # every figure the operator asked for, with its unit in the text
        assert r["usd_per_hour"] > 0 and r["usd_per_month"] == pytest.approx(r["usd_per_hour"] * 730, rel=1e-3)
        assert r["usd_per_mtok_input"] > 0 and r["usd_per_mtok_output"] > 0 and r["attainment"] >= 0.9
        assert r["headroom"]["max_rate_multiplier"] >= 1.0 and r["capacity_kind"] == "on_demand"
    assert a["checks"]["replica_loss"] in (True, False) and a["checks"]["region_loss"] in (True, False)
    assert {b["gpu"] for b in a["by_gpu"]} == {"H100", "A100"}  # each GPU type's best: the runner-up shown
    assert a["cost"]["api_comparisons"] and all("8B" in c["api"] or "8b" in c["api"]
                                                for c in a["cost"]["api_comparisons"])
    assert "$/month" in text and "$/Mtok" in text and "survives the loss of a replica" in text
    page = html.read_text()
    assert "TTFT SLO 500 ms" in page and "Replicas serving it" in page
    # The plan's JSON is what `argosy cost --plan` prices: the same fleet, the same monthly GPU bill.
    assert main(["cost", "--plan", str(out), "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["gpu_usd"] == pytest.approx(a["usd_per_month"], rel=0.01)
    assert est["slo"]["met"] is True and est["total_usd"] == pytest.approx(a["cost"]["total_usd"], rel=1e-6)
    assert main(["cost", "--sim", str(out)]) == 2
    assert "--plan" in capsys.readouterr().err


def test_plan_spare_region_grows_the_fleet_until_it_survives_a_region_loss(tmp_path, capsys):
    traffic = _traffic(tmp_path, rate=40, regions=[{"name": "a"}, {"name": "b"}])
    base, spare = tmp_path / "base.json", tmp_path / "spare.json"
    argv = ["plan", "--traffic", traffic, "--model-config", "llama-3.1-8b", "--slo-ttft", "300ms"]
    assert main([*argv, "-o", str(base)]) == 0
    assert main([*argv, "--spare", "region", "-o", str(spare)]) == 0
    capsys.readouterr()
    b, s = json.loads(base.read_text())["answer"], json.loads(spare.read_text())["answer"]
    assert s["checks"]["region_loss"] is True
    assert s["chosen"]["gpus"] >= b["chosen"]["gpus"]
    if b["checks"]["region_loss"] is False:
        assert s["chosen"]["gpus"] > b["chosen"]["gpus"]


def test_profile_gpu_reports_tokens_per_second_and_the_batch_that_fits(tmp_path, capsys):
    assert main(["profile", "--gpu", "H100", "--model-config", "llama-3.1-8b", "-o", str(tmp_path / "p.json")]) == 0
    text = capsys.readouterr().out
    assert "prefill" in text and "tokens/s" in text and "tok/s" in text
    rows = [line.split() for line in text.splitlines() if line.strip().split(" ")[0].replace(",", "").isdigit()]
    fits = [int(r[2].replace(",", "")) for r in rows]
    assert len(rows) >= 5 and fits == sorted(fits, reverse=True) and fits[0] > fits[-1] > 0  # longer: fewer fit


def test_log_axes_and_reference_lines_in_charts():
    from argosy.bench.svg import Series, chart

    svg = chart([Series("a", [1, 10, 1000], [0.5, 5, 50])], "t", "x", "y", log_x=True, log_y=True,
                hlines=((20.0, "SLO 20"),))
    assert ">1000<" in svg and ">0.1<" in svg and "SLO 20" in svg and "stroke-dasharray" in svg


def test_replicas_sharing_a_cpu_node_slow_each_other_down():
    # Two replicas, a constant 10 ms step, steady load on both: on their own cores a decode step takes
    # 10 ms; two busy replicas of one thread each on a one-core node take 20 ms; on two cores, 10 ms again.
    from tests.test_sim import simulate

    spec = {"duration_s": 30, "rate": 40, "prompt_tokens": {"mean": 64}, "output_tokens": {"mean": 40}}
    _, alone = simulate(spec, replicas=2)
    _, shared = simulate(spec, replicas=2, node_cores=1.0, replica_threads=1.0)
    _, roomy = simulate(spec, replicas=2, node_cores=2.0, replica_threads=1.0)
    assert alone["tpot_s"]["p50"] == pytest.approx(0.010)
    assert shared["tpot_s"]["p50"] == pytest.approx(0.020, rel=0.05)
    assert roomy["tpot_s"]["p50"] == pytest.approx(0.010)


def _trial(rate: float, slo_ttft_s: float = 0.5, duration_s: float = 60):
    from argosy.config import FleetConfig
    from argosy.sim.plan import Trial
    from argosy.sim.profile import RooflineSettings, model_shape, roofline_profile
    from argosy.sim.results import SLO
    from argosy.sim.traffic import TrafficSpec, make_requests

    spec = TrafficSpec.model_validate({"duration_s": duration_s, "rate": rate, "prompt_tokens": {"mean": 256},
                                       "output_tokens": {"mean": 32}})
    model = FleetConfig.model_validate({"models": [{"name": "m"}]}).models[0]
    profile = roofline_profile("H100", model_shape("llama-3.1-8b"), 1, RooflineSettings())
    return Trial(model, profile, spec, make_requests(spec), SLO(ttft_s=slo_ttft_s, attainment=0.9), 2.0, "H100")


def test_plan_stops_simulating_a_fleet_once_it_has_certainly_failed():
    """A fleet too small for the load is stopped once more requests have missed the SLO than the target
    allows; the attainment it then reports is a bound that the whole run does not beat."""
    from argosy.sim.fleet import FleetSim, SimSettings
    from argosy.sim.results import attainment_by_region

    trial = _trial(rate=150)
    region = trial.spec.regions[0].name
    small = trial.candidate({region: 1})
    assert small["met"] is False and small["ttft_p99_s"] is None
    assert small["gave_up_s"] is not None and small["gave_up_s"] < trial.spec.duration_s / 2
    assert small["attainment"] < 0.9 and small["requests_missed"] > 0.1 * len(trial.reqs) * 0.9
    whole = FleetSim(trial.model, trial.profile, trial.spec, trial.reqs, SimSettings(replicas=1))
    whole.run()
    assert attainment_by_region(whole, trial.slo, trial.warmup_s())[region] <= small["attainment_by_region"][region]
    enough = trial.candidate({region: 3})  # a passing fleet is simulated to the end and measured
    assert enough["met"] is True and enough["gave_up_s"] is None and enough["ttft_p99_s"] < 0.5


def test_requests_unfinished_when_a_simulation_stops_count_as_missed():
    from argosy.sim.fleet import FleetSim, SimSettings
    from argosy.sim.results import summarize

    trial = _trial(rate=150, duration_s=20)
    sim = FleetSim(trial.model, trial.profile, trial.spec, trial.reqs, SimSettings(replicas=1, drain_limit_s=0))
    sim.run()
    res = summarize(sim, trial.slo)
    assert sim.done and all(r.seq is None for r in sim.done)  # a finished request lets go of its tokens
    n = res["requests"]
    assert n["unfinished"] > 0 and n["completed"] + n["failed"] + n["unfinished"] == len(trial.reqs)
    met = res["throughput"]["goodput_requests_per_s"] * trial.spec.duration_s
    assert res["slo"]["attainment"] == pytest.approx(met / len(trial.reqs), abs=1e-6)


def test_plan_searches_configurations_in_parallel_with_the_same_answer(tmp_path, capsys):
    import multiprocessing

    traffic = _traffic(tmp_path, rate=60)
    argv = ["plan", "--traffic", traffic, "--model-config", "llama-3.1-8b", "--gpus", "H100,A100",
            "--max-num-seqs", "64,256", "--slo-ttft", "500ms"]
    answers = {}
    for jobs in (1, 3):
        out = tmp_path / f"plan-{jobs}.json"
        assert main([*argv, "--jobs", str(jobs), "-o", str(out)]) == 0
        res = json.loads(out.read_text())
        answers[jobs] = (res["answer"]["chosen"], [c["replicas"] for c in res["candidates"]],
                         [c["label"] for c in res["passing"]])
        assert not multiprocessing.active_children()  # no worker outlives the plan
    assert "4 configurations, 3 at a time" in capsys.readouterr().err
    assert answers[1] == answers[3] and len(answers[1][2]) == 4
    assert main([*argv, "--jobs", "0"]) == 2 and "--jobs must be at least 1" in capsys.readouterr().err


def _alive(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_plan_workers_end_with_a_plan_that_is_killed(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    traffic = _traffic(tmp_path, duration_s=600, rate=200)
    proc = subprocess.Popen([sys.executable, "-m", "argosy.cli", "plan", "--traffic", traffic, "--model-config",
                             "llama-3.1-8b", "--gpus", "H100,A100", "--jobs", "2", "-o", str(tmp_path / "p.json")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    workers: list[str] = []
    try:
        for line in proc.stderr:  # a worker has simulated a candidate: both are at work, mid-search
            if "replicas ->" in line:
                break
        workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(workers) >= 2 and proc.poll() is None  # its workers (and multiprocessing's tracker)
        proc.kill()  # no chance to clean up: the workers must notice on their own
        proc.wait()
        deadline = time.monotonic() + 10
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_alive, workers))
    finally:
        proc.kill()
        proc.stderr.close()
        for pid in workers:
            if _alive(pid):
                os.kill(int(pid), signal.SIGKILL)


@pytest.mark.parametrize("flags, message", [
    (["--tp", "1,0"], "--tp and --max-num-seqs must be at least 1"),
    (["--max-num-seqs", "0"], "--tp and --max-num-seqs must be at least 1"),  # had been simulated, never served
    (["--gpus", "H100,H10"], "unknown accelerator 'H10'"),  # had been skipped, then "widen the search space"
])
def test_plan_flags_no_fleet_can_have_are_one_line(tmp_path, capsys, flags, message):
    assert main(["plan", "--traffic", _traffic(tmp_path), "--model-config", "llama-3.1-8b", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("argosy plan: error:") and err.count("\n") == 1


def test_a_tp_size_the_model_cannot_split_over_is_not_priced(tmp_path, capsys):
    from argosy.sim.profile import model_shape, roofline_profile

    shape = model_shape("llama-3.1-8b")  # 32 attention heads, 8 KV heads, 14336 MLP rows
    assert roofline_profile("H100", shape, tp=2).name  # splits
    with pytest.raises(ValueError, match=r"does not split over TP 3: .*num_attention_heads \(32\)"):
        roofline_profile("H100", shape, tp=3)  # the engine would refuse such a replica
    out = tmp_path / "plan.json"
    assert main(["plan", "--traffic", _traffic(tmp_path, duration_s=20, rate=5), "--model-config", "llama-3.1-8b",
                 "--tp", "1,3", "--jobs", "1", "-o", str(out)]) == 0
    assert "skip H100 TP 3: llama-3.1-8b does not split over TP 3" in capsys.readouterr().err
    assert {c["tp"] for c in json.loads(out.read_text())["candidates"]} == {1}
    assert main(["sim", "--traffic", _traffic(tmp_path), "--gpu", "H100", "--model-config", "llama-3.1-8b",
                 "--tp", "3"]) == 2
