"""The fleet simulator: the real scheduler, router and autoscaler inside; hand-computable cases."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from argosy.config import ModelConfig
from argosy.sim.fleet import FleetSim, SimSettings
from argosy.sim.profile import ModelShape, RooflineSettings, StepProfile, roofline_profile
from argosy.sim.results import SLO, summarize
from argosy.sim.traffic import TrafficSpec, make_requests


def constant_profile(step_s: float = 0.01, num_blocks: int = 4096, cold_start_s: float = 5.0) -> StepProfile:
    return StepProfile("const", "H100", "measured", "sum", step_s, 0.0, 0.0, 0.0, 0.0, num_blocks, 16, cold_start_s)


def simulate(spec: dict, model: dict | None = None, profile: StepProfile | None = None, **settings):
    sim = FleetSim(ModelConfig(name="m", **(model or {})), profile or constant_profile(), TrafficSpec(**spec),
                   make_requests(TrafficSpec(**spec)), SimSettings(**settings))
    sim.run()
    return sim, summarize(sim, SLO(2.0, 0.1))


def test_one_replica_constant_step_is_hand_computable():
    # 20 output tokens at 10 ms a step: the prefill step gives the first token, 19 decode steps the rest.
    # An arrival waits at most for the step in progress, so TTFT is in [10, 20) ms and E2E in [200, 210) ms.
    sim, res = simulate({"duration_s": 60, "rate": 4, "prompt_tokens": {"mean": 100},
                         "output_tokens": {"mean": 20}}, replicas=1)
    assert res["requests"]["failed"] == 0 and res["requests"]["completed"] == len(sim.reqs)
    assert 0.010 - 1e-9 <= res["ttft_s"]["p50"] and res["ttft_s"]["p99"] < 0.020 + 1e-9
    assert res["tpot_s"]["p50"] == pytest.approx(0.010) and res["tpot_s"]["p99"] == pytest.approx(0.010)
    assert 0.200 - 1e-9 <= res["e2e_s"]["p50"] < 0.210 + 1e-9
    # Little's law: requests in the system = arrival rate x time in the system; busy time = steps x 10 ms.
    assert res["throughput"]["requests_per_s"] == pytest.approx(len(sim.reqs) / 60)
    busy = sim.all_replicas[0].busy_s
    assert busy <= len(sim.reqs) * 20 * 0.010 + 1e-6  # batching only saves steps
    assert res["input_tokens"] == 100 * len(sim.reqs) and res["output_tokens"] == 20 * len(sim.reqs)
    assert res["gpu_hours"] == {"H100": pytest.approx(60 / 3600, rel=1e-4)}
    assert res["token_time_split"]["input"] + res["token_time_split"]["output"] == pytest.approx(1.0)


def test_small_kv_preempts_with_the_real_scheduler_and_everything_completes():
    sim, res = simulate({"duration_s": 20, "rate": 20, "prompt_tokens": {"mean": 200},
                         "output_tokens": {"mean": 200}}, profile=constant_profile(num_blocks=80), replicas=1)
    assert res["preemptions"] > 0
    assert res["requests"]["completed"] == len(sim.reqs)
    rep = sim.all_replicas[0]
    rep.kv.check_integrity()
    assert rep.kv.num_free_blocks == rep.kv.num_blocks  # every block came back


def test_shared_prefixes_hit_the_prefix_cache_and_prefix_routing_hits_more_than_round_robin():
    spec = {"duration_s": 20, "rate": 40, "prompt_tokens": {"mean": 64}, "output_tokens": {"mean": 16},
            "shared_prefix": {"tokens": 512, "groups": 8}}
    small = constant_profile(num_blocks=160)  # room for about four prefixes per replica
    _, none = simulate({**spec, "shared_prefix": None}, replicas=4)
    _, rr = simulate(spec, {"routing": {"policy": "round_robin"}}, profile=small, replicas=4)
    _, px = simulate(spec, {"routing": {"policy": "prefix"}}, profile=small, replicas=4)
    assert none["prefix_cache_hit_rate"] == 0.0
    assert rr["prefix_cache_hit_rate"] > 0.1
    assert px["prefix_cache_hit_rate"] > rr["prefix_cache_hit_rate"] + 0.1


def test_autoscaler_adds_replicas_under_a_spike_and_cold_starts_delay_ttft():
    spec = {"duration_s": 120, "rate": 10, "prompt_tokens": {"mean": 64}, "output_tokens": {"mean": 100},
            "spikes": [{"at_s": 30, "duration_s": 60, "multiplier": 6}]}
    model = {"engine": {"max_num_seqs": 16}, "autoscaling": {"min_replicas": 1, "max_replicas": 10, "target": 8,
                                                              "tick_s": 2, "stable_window_s": 20}}
    fast_sim, fast = simulate(spec, model, profile=constant_profile(0.02, cold_start_s=1.0))
    _, slow = simulate(spec, model, profile=constant_profile(0.02, cold_start_s=40.0))
    assert fast["max_replicas"] >= 4
    assert any(d["desired"] > 1 for d in fast_sim.decisions)
    assert slow["ttft_s"]["p99"] > 2 * fast["ttft_s"]["p99"]


def test_a_failed_regions_traffic_moves_to_the_others():
    spec = {"duration_s": 60, "rate": 20, "prompt_tokens": {"mean": 64}, "output_tokens": {"mean": 20},
            "regions": [{"name": "a"}, {"name": "b"}], "failover_rtt_s": 0.5,
            "failures": [{"region": "b", "at_s": 20, "duration_s": 20}]}
    sim, res = simulate(spec, replicas=2)
    assert res["requests"]["failed"] <= 10  # only streams cut mid-way on b's replicas
    moved = [r for r in sim.done if r.extra_latency_s > 0]
    assert moved and all(r.region == 1 and 20 <= r.arrival_s < 40 for r in moved)
    assert all(sim.by_name[r.replica].region == 0 for r in moved)
    during = [row for row in sim.timeline if 25 <= row["t"] < 40]
    assert during and all(row["replicas"]["b"] == 0 for row in during)
    assert sim.timeline[-1]["replicas"]["b"] == 2  # recovered (after a cold start)


def test_roofline_hand_computed():
    cfg = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    shape = ModelShape.from_config("toy", cfg)
    # per layer: q,o 2*64*64 + k,v 2*64*32 + mlp 3*64*128 + 2 norms of 64 = 36992; x2 layers; embed + head
    # 2*1000*64; final norm 64.
    assert shape.params == 2 * 36992 + 128000 + 64 == 202048
    assert shape.kv_bytes_per_token_per_byte == 2 * 2 * 2 * 16
    assert shape.attn_flops_per_pair == 4 * 2 * 4 * 16
    p = roofline_profile("H100", shape, 1, RooflineSettings(compute_efficiency=0.5, memory_efficiency=0.5,
                                                            step_overhead_s=0.001))
    flops, bw = 989e12 * 0.5, 3350e9 * 0.5
    matmul = 202048 - 64000  # the untied input embedding is gathered, not multiplied nor read whole
    assert p.per_decode_seq_s == pytest.approx(2 * matmul / flops)
    assert p.per_prefill_token_s == pytest.approx(2 * (matmul - 64000) / flops)  # prompt tokens skip the LM head
    assert p.mem_base_s == pytest.approx(2 * matmul / bw)
    assert p.per_kv_token_s == pytest.approx(128 * 2 / bw)
    # One decode of 1 sequence at 1000 tokens of context: memory-bound (weights, then the KV cache).
    assert p.step_s(0, 1, 1000) == pytest.approx(0.001 + (2 * matmul + 1000 * 256) / bw)
    # A big decode batch: its matmuls are compute-bound, and attention still reads the whole KV cache.
    assert p.step_s(0, 10_000, 10_000_000) == pytest.approx(0.001 + 10_000 * 2 * matmul / flops + 10_000_000 * 256 / bw)
    assert p.decode_run_s(10_000, 10_000_000, 2) == pytest.approx([p.step_s(0, 10_000, 10_000_000),
                                                                   p.step_s(0, 10_000, 10_010_000)])
    # A prefill of 100k tokens: compute-bound matmuls, then causal attention over 100k x 50k pairs.
    pairs = 100_000 * 50_000
    assert p.step_s(100_000, 0, 100_000, pairs) == pytest.approx(
        0.001 + 100_000 * 2 * (matmul - 64000) / flops + pairs * 512 / flops)
    with pytest.raises(ValueError, match="does not fit"):
        roofline_profile("L40S", ModelShape("huge", 70e9, 80, 2 * 80 * 8 * 128))


def test_catalogue_llama_2_70b_is_mlperfs_model_and_a_roofline_step_reads_its_kv_after_its_matmuls():
    from argosy.sim.profile import model_shape

    shape = model_shape("llama-2-70b")  # MLPerf Inference's llama2-70b: 68.98B parameters, GQA with 8 KV heads
    assert shape.params == 68_976_648_192
    assert shape.kv_bytes_per_token_per_byte == 2 * 80 * 8 * 128
    p = roofline_profile("H100", shape, 2, RooflineSettings(dtype="fp8", step_overhead_s=0.0, tp_overhead_s=0.0))
    # TP 2 over NVLink (900 GB/s both ways, 70% of it): each layer all-reduces 16-bit activations twice, a
    # ring moving 2 (tp - 1) / tp of them each way.
    assert p.per_token_comm_s == pytest.approx(2 * 80 * 8192 * 2 * 2 * (1 / 2) / (450e9 * 0.7))
    matmuls, kv = p.per_decode_seq_s * 896, p.per_kv_token_s * 896 * 400
    # 896 decodes at 400 tokens of context (MLPerf's batch): compute-bound matmuls, their all-reduces, and
    # the KV read besides.
    assert matmuls > p.mem_base_s
    assert p.step_s(0, 896, 896 * 400) == pytest.approx(matmuls + 896 * p.per_token_comm_s + kv)


def test_week_levels_and_their_weights():
    from argosy.sim.week import HOURS, hourly_levels, weigh

    spec = TrafficSpec(duration_s=604800, rate=100, weekly=[1, 1, 1, 1, 1, 0.5, 0.5],
                       regions=[{"name": "a"}, {"name": "b"}],
                       failures=[{"region": "b", "at_s": 3600 * 50, "duration_s": 3600}])
    levels = hourly_levels(spec, 0.05)
    assert sum(len(lv.hours) for lv in levels) == HOURS
    assert sorted((lv.rate, lv.down, len(lv.hours)) for lv in levels) == [
        (50.0, (), 48), (100.0, (), 119), (100.0, ("b",), 1)]
    fake = lambda gpu_h, tin, ttft, busy=1.0: {  # noqa: E731
        "gpu_hours": {"H100": gpu_h}, "input_tokens": tin, "output_tokens": tin // 2,
        "token_time_split": {"input": 0.5, "output": 0.5}, "gpu_busy_share": busy, "max_replicas": 1,
        "requests": {"completed": 10, "failed": 0}, "slo": {"attainment": 1.0},
        "ttft_s": {"p50": ttft, "p90": ttft, "p99": ttft}, "tpot_s": {"p50": 0.01, "p90": 0.01, "p99": 0.01},
        "e2e_s": {"p50": 1.0, "p90": 1.0, "p99": 1.0}}
    week = weigh([(levels[0], fake(0.1, 1000, 0.2)), (levels[1], fake(0.2, 2000, 0.4, busy=0.5)),
                  (levels[2], fake(0.1, 1000, 1.0))], spec, level_s=360.0, warmup_s=0.0)
    # a 360 s level stands for 10x its hours: 48 h -> 480 copies of 0.1 GPU-h, 119 h -> 1190 of 0.2, 1 h -> 10 of 0.1
    assert week["gpu_hours"]["H100"] == pytest.approx(48 + 238 + 1)
    assert week["input_tokens"] == 480 * 1000 + 1190 * 2000 + 10 * 1000
    assert week["ttft_s"]["p99"] == pytest.approx((48 * 0.2 + 119 * 0.4 + 1 * 1.0) / 168)
    assert week["gpu_busy_share"] == pytest.approx((48 + 238 * 0.5 + 1) / 287, abs=1e-6)  # busy GPU-h / GPU-h


def test_sim_cli_writes_the_result_keys_the_cost_estimator_reads(tmp_path, capsys):
    from argosy.cli import main

    traffic = tmp_path / "t.yaml"
    traffic.write_text("duration_s: 20\nrate: 20\nprompt_tokens: {mean: 256}\noutput_tokens: {mean: 32}\n")
    out, html = tmp_path / "r.json", tmp_path / "r.html"
    assert main(["sim", "--traffic", str(traffic), "--gpu", "A100", "--model-config", "llama-3.1-8b",
                 "--replicas", "2", "-o", str(out), "--html", str(html)]) == 0
    res = json.loads(out.read_text())
    assert set(res["gpu_hours"]) == {"A100"} and res["gpu_hours"]["A100"] == pytest.approx(2 * 20 / 3600, rel=1e-4)
    assert res["duration_s"] == 20 and res["input_tokens"] > 0 and res["output_tokens"] > 0
    assert 0 < res["token_time_split"]["input"] < 1
    assert "<svg" in html.read_text()
    assert "SLO attainment" in capsys.readouterr().out


@pytest.mark.parametrize("traffic, extra, message", [
    ("duration_s: 10\nrat: 5\n", [], "rat"),
    ("duration_s: -1\n", [], "duration_s"),
    ("duration_s: 10\nregions: [{name: a}]\nfailures: [{region: z, at_s: 1, duration_s: 1}]\n", [], "unknown region"),
    ("duration_s: 10\n", ["--gpu", "TPU9"], "unknown accelerator"),
    (None, [], "cannot|No such file"),
    ("duration_s: [\n", [], r"t\.yaml:2:1: YAML syntax error"),
    ("duration_s: 10\nrate: 5\nrate: 50\n", [], r"t\.yaml:3:1: YAML syntax error: 'rate' given twice"),
    ("duration_s: 1.0e+12\nrate: 1.0e+9\n", [], "at most 10,000,000"),  # numpy had raised mid-generation
    ("duration_s: 1.0e+12\nrate: 1.0e+9\n", ["--week", "--gpu", "H100"], "at most 10,000,000"),
    # each had run the whole simulation, then a traceback (an output folder missing) or a silent change
    ("duration_s: 10\n", ["--gpu", "H100", "-o", "/nonexistent/dir/x.json"], "/nonexistent/dir is not a folder"),
    ("duration_s: 10\n", ["--gpu", "H100", "--html", "/nonexistent/x.html"], "--html .*not a folder"),
    ("duration_s: 10\n", ["--gpu", "H100", "--price-tier", "gold"], "unknown tier 'gold'"),  # no cost line
    ("duration_s: 10\n", ["--gpu", "H100", "--provider", "nosuchcloud"], "unknown provider 'nosuchcloud'"),
    ("duration_s: 10\n", ["--gpu", "H100", "--slo-ttft", "0s"], "must be more than 0"),  # had been 0.0% attained
    ("duration_s: 10\nrate: 1\nprompt_tokens: {mean: 100000000}\n", [], "more than a replica's KV cache holds"),
])
def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys, traffic, extra, message):
    from argosy.cli import main

    path = tmp_path / "t.yaml"
    if traffic is not None:
        path.write_text(traffic)
    args = ["sim", "--traffic", str(path), "--model-config", "llama-3.1-8b"] + (extra or ["--gpu", "H100"])
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    if "--week" in extra:
        err = err.splitlines()[-1]  # after the line that names its levels
    assert err.startswith("argosy sim: error:") and "\n" not in err and "Traceback" not in err
    import re
    assert re.search(message, err)


@pytest.mark.parametrize("trace, message", [
    (None, "trace .*no-such.jsonl: No such file"),  # each had been a traceback
    ("", "empty trace"),
    ('{"timestamp": "soon", "prompt_tokens": 5}\n', ":1: bad trace line .*could not convert"),
    ('{"timestamp": 0, "prompt_tokens": -5, "output_tokens": 0}\n', ":1: bad trace line .*of 1 or more"),  # had run
    ('{"timestamp": 0, "prompt_tokens": 5}\n{"timestamp": 1e999, "prompt_tokens": 5}\n', ":2: .*a finite timestamp"),
])
def test_a_traffic_files_trace_mistakes_are_one_line(tmp_path, capsys, trace, message):
    import re

    from argosy.cli import main

    name = "no-such.jsonl" if trace is None else "trace.jsonl"
    if trace is not None:
        (tmp_path / name).write_text(trace)
    (tmp_path / "t.yaml").write_text(f"duration_s: 10\ntrace: {name}\n")
    for command in (["sim", "--gpu", "H100"], ["plan"]):
        assert main([*command, "--traffic", str(tmp_path / "t.yaml"), "--model-config", "llama-3.1-8b"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"argosy {command[0]}: error:") and "\n" not in err and re.search(message, err)


def test_profile_measures_the_engine_and_a_served_replica_then_sim_reads_it(tmp_path, capsys):
    from argosy.cli import main
    from argosy.engine.random_model import make_random_model
    from argosy.sim.profile import load_profile

    ckpt = tmp_path / "tiny"
    make_random_model(ckpt, size="tiny", vocab_size=512)
    out = tmp_path / "profile.json"
    assert main(["profile", "--model", str(ckpt), "--max-num-seqs", "4", "--max-num-batched-tokens", "64",
                 "--kv-cache-memory", "0.05", "-o", str(out)]) == 0
    prof = load_profile(out)
    assert prof.source == "measured" and "served" in prof.name
    # The capacity table ends at the model's own context (the built-in model's 512 had run on to 131,072).
    context = json.loads((ckpt / "config.json").read_text())["max_position_embeddings"]
    printed = capsys.readouterr()
    rows = [int(x.replace(",", "")) for x in re.findall(r"^\s+([\d,]+) tok ", printed.out, re.M)]
    assert rows and rows[-1] == context, (rows, context)
    obs = prof.notes["observations"]
    assert len(obs) >= 10 and all(t > 0 for *_, t in obs)
    serving = prof.notes["serving"]
    assert sorted(serving["observations"]) == ["1", "4"]  # the burst sizes up to max_num_seqs
    assert len(serving["observations"]["1"]) > 30  # a burst of one per repeat, and every lone request
    assert len(serving["observations"]["4"]) == 9  # a sample a burst: nine, after a warm-up, from one bench
    assert [b for b, _ in prof.serving_table] == sorted(b for b, _ in prof.serving_table)
    assert prof.serving_table[0][0] == 1 and 1 < prof.serving_table[-1][0] <= 4  # the mean batch decoded in
    assert prof.request_s == serving["request_s"] >= 0
    # Steps after 1, 2 and 3 neighbours' worth of weights went through the cache: one figure each, >= 0.
    assert [n for n, _ in prof.neighbour_step_table] == [1.0, 2.0, 3.0]
    assert all(t >= 0 for _, t in prof.neighbour_step_table)
    assert len(prof.request_s_quantiles) == 20 and list(prof.request_s_quantiles) == sorted(prof.request_s_quantiles)
    # Beside a spinning process on every core the steps lose whole slices of the kernel's scheduler: a few ms.
    assert 0.0005 < prof.time_slice_s < 0.05
    assert "time slice" in printed.err
    traffic = tmp_path / "t.yaml"
    traffic.write_text("duration_s: 20\nrate: 2\nprompt_tokens: {mean: 32}\noutput_tokens: {mean: 8}\n")
    res = tmp_path / "r.json"
    assert main(["sim", "--profile", str(out), "--traffic", str(traffic), "--replicas", "1", "-o", str(res)]) == 0
    r = json.loads(res.read_text())
    assert r["requests"]["completed"] > 0
    assert r["ttft_s"]["p50"] >= prof.request_s  # every request pays the serving overhead


def test_serving_table_is_read_by_batch_and_a_burst_counts_the_batch_it_decoded_in():
    from argosy.sim.measure_serving import _served_step

    base = constant_profile(0.010)
    prof = dataclasses.replace(base, serving_table=((1.0, 0.002), (4.0, -0.001)))
    assert prof.step_s(0, 1, 100) == pytest.approx(0.012)
    assert prof.step_s(0, 2, 100) == pytest.approx(0.011)  # between the measured batches
    assert prof.step_s(0, 16, 100) == pytest.approx(0.009)  # flat beyond them; negative corrects a slow sweep
    assert prof.step_s(32, 0, 32) == pytest.approx(0.012)  # a prefill-only step takes the batch-1 figure
    with pytest.raises(ValueError, match="serving_table"):
        dataclasses.replace(base, serving_table=((1.0, float("nan")),))
    # Three requests: the last decodes from 1.0 s to 2.0 s; one other decodes beside it until 1.5 s, one
    # ended before it started: it decoded at a mean batch of 1.5, not 3.
    recs = [{"sent_s": 0.0, "ttft_s": 0.2, "e2e_s": 1.5, "prompt_tokens": 8, "output_tokens": 11},
            {"sent_s": 0.0, "ttft_s": 0.1, "e2e_s": 0.9, "prompt_tokens": 8, "output_tokens": 11},
            {"sent_s": 0.0, "ttft_s": 1.0, "e2e_s": 2.0, "prompt_tokens": 8, "output_tokens": 11}]
    batch, excess = _served_step(recs, base)
    assert batch == pytest.approx(1.5)
    assert excess == pytest.approx(0.1 - 0.010)  # 1 s over 10 tokens, less the profile's step


def test_prefill_and_mixed_steps_read_the_measured_tables():
    # Decode steps: 4 ms fixed + 1 ms a sequence (at both contexts); prefills: 10 ms at 100 tokens, 30 at 300.
    table = tuple((b, ctx, 0.004 + 0.001 * b) for ctx in (32, 256) for b in (1, 2, 4))
    prof = dataclasses.replace(constant_profile(0.5), decode_table=table, prefill_table=((100, 0.010), (300, 0.030)))
    assert prof.step_s(200, 0, 200) == pytest.approx(0.020)  # between the measured prefills, not the 0.5 s line
    assert prof.step_s(0, 2, 128) == pytest.approx(0.006)
    # A prefill with two decodes beside it: the decodes add their 2 ms, not their step's 4 ms fixed cost again.
    assert prof.step_s(100, 2, 100 + 2 * 64) == pytest.approx(0.012)
    assert prof.step_s(1, 0, 1) == pytest.approx(0.005)  # never below half the smallest measured prefill


def test_a_week_runs_its_levels_on_two_workers_and_weighs_them_all():
    from argosy.sim.week import hourly_levels, plan_week

    spec = TrafficSpec(duration_s=604800, rate=40, weekly=[1, 1, 1, 1, 1, 0.5, 0.25],
                       prompt_tokens={"mean": 64}, output_tokens={"mean": 16})
    levels = hourly_levels(spec, level_step=0.25)
    lines = []
    week = plan_week(ModelConfig(name="m"), constant_profile(0.005), spec, SLO(), settings=SimSettings(replicas=1),
                     level_s=6.0, warmup_s=2.0, level_step=0.25, workers=2, progress=lines.append)
    assert "2 at a time" in lines[0] and len(lines) == 1 + len(levels) >= 3
    assert [lv["rate_rps"] for lv in week["levels"]] == [lv.rate for lv in levels]  # in order, whoever ran them
    assert week["hours"] == 168 and week["attainment"] > 0.9
    one = plan_week(ModelConfig(name="m"), constant_profile(0.005), spec, SLO(), settings=SimSettings(replicas=1),
                    level_s=6.0, warmup_s=2.0, level_step=0.25, workers=1, progress=lambda m: None)
    assert one["output_tokens"] == week["output_tokens"]  # fixed replicas: each level's result is the same


def test_a_profile_saved_with_a_serving_line_loads_as_a_table(tmp_path):
    from argosy.sim.profile import load_profile

    data = dataclasses.asdict(constant_profile(0.010))
    del data["serving_table"], data["prefill_table"]
    data.update(serving_step_s=0.001, serving_per_seq_s=0.0001)  # as argosy profile wrote it before
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    prof = load_profile(path)
    assert prof.step_s(0, 1, 16) == pytest.approx(0.010 + 0.0011)
    assert prof.step_s(0, 64, 16) == pytest.approx(0.010 + 0.001 + 64 * 0.0001)


def test_sigterm_stops_plan_and_its_workers_as_ctrl_c_does(tmp_path):
    """`kill PID` (a container's stop) had killed `argosy plan` outright: its spawned workers' semaphores leaked
    (a resource-tracker warning). Now it ends as Ctrl-C does (its pool stopped): exit 143, no traceback."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    traffic = tmp_path / "t.yaml"
    traffic.write_text("duration_s: 600\nrate: 200\n")
    root = Path(__file__).resolve().parents[1]
    p = subprocess.Popen([sys.executable, "-m", "argosy.cli", "plan", "--traffic", str(traffic), "--model-config",
                          "llama-3.1-8b", "--gpus", "H100,A100", "--jobs", "2"], cwd=root, text=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while "searching" not in (line := p.stderr.readline()):  # the workers run from here on
            assert line, "plan ended before its search"
        time.sleep(2)
        p.send_signal(signal.SIGTERM)
        err = p.communicate(timeout=60)[1]
    finally:
        p.kill()
    assert p.returncode == 143, err
    assert "leaked" not in err and "Traceback" not in err, err
