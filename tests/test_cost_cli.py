"""`argosy cost` end to end through `argosy.cli.main`, on hand-computed cases."""

import json

import pytest

from argosy.bench import results
from argosy.bench.record import RequestRecord
from argosy.cli import main
from tests.test_cost_prices import SMALL_BOOK


@pytest.fixture
def prices(tmp_path):
    # Round numbers: H100 on demand at beta for $2.00 (alpha asks $3.00), spot at beta $1.20.
    path = tmp_path / "prices.yaml"
    path.write_text(SMALL_BOOK.replace("usd_per_gpu_hour: 2.50", "usd_per_gpu_hour: 2.00"))
    return str(path)


def _sim(tmp_path, **over):
    # One simulated hour on 2 H100s: 3M input and 1M output tokens, 1000 requests, 25 % of GPU time on input.
    result = {"duration_s": 3600.0, "gpu_hours": {"H100": 2.0}, "input_tokens": 3_000_000,
              "output_tokens": 1_000_000, "token_time_split": {"input": 0.25, "output": 0.75},
              "requests": {"completed": 1000, "failed": 0, "measured_from_s": 0.0}}
    result.update(over)
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(result))
    return str(path)


def _run_json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_sim_month_hand_computed(tmp_path, capsys, prices):
    est = _run_json(capsys, ["cost", "--sim", _sim(tmp_path), "--prices", prices, "--period", "month",
                             "--utilization", "0.5", "--api", "hosted/big"])
    # A month is 730 h, 730x the simulated hour: 1460 GPU-h at $2.00 (beta, the cheaper) = $2,920.
    assert est["gpu_hours"] == 1460 and est["gpu_usd"] == 2920.0 and est["gpus"][0]["provider"] == "beta"
    assert est["traffic"]["input_tokens"] == 2_190_000_000 and est["traffic"]["output_tokens"] == 730_000_000
    # Input: 0.25 x 2920 = $730 over 2190 Mtok = $0.3333/Mtok; output: $2,190 over 730 Mtok = $3.00/Mtok.
    assert est["usd_per_mtok_input"] == pytest.approx(0.3333, abs=1e-4)
    assert est["usd_per_mtok_output"] == pytest.approx(3.0)
    # Engineering 0.1 x 87,600 x 730/8760 = $730; monitoring 1 node x $80 + $20 = $100; operations $730.
    assert est["lines"] == {"gpus": 2920.0, "engineering": 730.0, "monitoring": 100.0, "operations": 730.0}
    assert est["total_usd"] == 4480.0
    assert est["idle_gpu_usd"] == 1460.0  # half of $2,920 at 50 % utilization
    # API: 2190 Mtok x $1 + 730 Mtok x $3 = $4,380, $100 less than self-hosting.
    (cmp,) = est["api_comparisons"]
    assert cmp["api_usd"] == 4380.0 and cmp["self_hosting_saves_usd"] == -100.0
    # Break-even: F = 730 + 730 + 20 = $1,480; one GPU replica p = 730 x (2.00 + 80/8/730) = $1,470;
    # it serves 2920M tokens / 1460 GPU-h / 0.5 = 4M tokens per GPU-h, cap = 2,920M a month;
    # a = $4,380 / 2,920M tokens = 1.5e-6 $/token; m = 4380 - 1470 = 2910.
    # n1 = ceil(1480/2910) = 1, V1 = (1480 + 1470) / 1.5e-6 = 1,966.67M tokens/month = x 24/730 a day.
    # k = ceil(2950/2910) = 2, Vk = (1480 + 2940) / 1.5e-6 = 2,946.67M tokens/month.
    be = cmp["break_even"]
    assert be["replicas"] == 1 and be["tokens_per_day"] == pytest.approx(1966.667e6 * 24 / 730, rel=1e-6)
    assert be["always_cheaper_replicas"] == 2
    assert be["always_cheaper_from_tokens_per_day"] == pytest.approx(2946.667e6 * 24 / 730, rel=1e-6)
    # 4,000 tokens a request: 1,966.67M / 4000 / (730 x 3600 s) = 0.187 req/s
    assert be["requests_per_s"] == pytest.approx(0.187, abs=1e-3)


def test_sim_busy_share_and_warmup(tmp_path, capsys, prices):
    # The sim's own busy share replaces --utilization; 750 requests counted after a 900 s warm-up of a
    # 3600 s run are 750 x 3600 / 2700 = 1000 over the run: the same figures as the flag case above.
    sim = _sim(tmp_path, gpu_busy_share=0.5, requests={"completed": 750, "failed": 3, "measured_from_s": 900.0})
    est = _run_json(capsys, ["cost", "--sim", sim, "--prices", prices, "--api", "hosted/big"])
    assert est["utilization"] == 0.5 and est["utilization_from"] == "simulation"
    assert est["traffic"]["requests"] == 730_000
    be = est["api_comparisons"][0]["break_even"]
    assert be["tokens_per_day"] == pytest.approx(1966.667e6 * 24 / 730, rel=1e-6)
    assert be["requests_per_s"] == pytest.approx(0.187, abs=1e-3)


def test_text_report_has_units(tmp_path, capsys, prices):
    assert main(["cost", "--sim", _sim(tmp_path), "--prices", prices, "--period", "week"]) == 0
    out = capsys.readouterr().out
    assert "one week (168 h)" in out
    for text in ("$/GPU-h", "GPU-h", "$/Mtok", " %", "$", "hosted/big", "tok/day", "req/s"):
        assert text in out, text
    # hosted/small at $0.10/$0.20 per Mtok is cheaper than a busy GPU's tokens: said, not divided by zero.
    assert "hosted/small: the API is cheaper at every volume" in out
    assert "Prices: test prices, made up" in out  # the price file's note, every time


def test_overhead_flags_override_the_book(tmp_path, capsys, prices):
    est = _run_json(capsys, ["cost", "--sim", _sim(tmp_path), "--prices", prices, "--api", "hosted/big",
                             "--engineering-fte", "0", "--operations", "0", "--monitoring-per-node", "0",
                             "--monitoring-fixed", "0"])
    assert est["total_usd"] == est["gpu_usd"] == 2920.0  # only the GPUs are left
    # No fixed cost: one replica (p = 730 h x $2.00 = $1,460) pays off at p / a = 1460 / 1.5e-6 = 973.33M
    # tokens a month. Busy (u = 1), it serves cap = 730 h x 2M = 1,460M tokens: m = 2190 - 1460 = 730,
    # k = ceil(1460 / 730) = 2, V_k = 2 x 1460 / 1.5e-6 = 1,946.67M tokens a month.
    be = est["api_comparisons"][0]["break_even"]
    assert be["replicas"] == 1 and be["tokens_per_day"] == pytest.approx(973.333e6 * 24 / 730, rel=1e-6)
    assert be["always_cheaper_replicas"] == 2
    assert be["always_cheaper_from_tokens_per_day"] == pytest.approx(1946.667e6 * 24 / 730, rel=1e-6)


def test_tier_mix_and_provider(tmp_path, capsys, prices):
    # Half on demand at alpha ($3.00), half spot at... alpha has no spot: a clear error, exit 2.
    assert main(["cost", "--sim", _sim(tmp_path), "--prices", prices, "--tier", "on_demand=0.5,spot=0.5",
                 "--provider", "alpha"]) == 2
    assert "no spot price for H100 from alpha" in capsys.readouterr().err
    est = _run_json(capsys, ["cost", "--sim", _sim(tmp_path), "--prices", prices, "--period", "week",
                             "--tier", "on_demand=0.5,spot=0.5"])
    # A week: 336 GPU-h, 168 on demand at $2.00 + 168 spot at $1.20 = 336 + 201.6 = $537.60
    assert [(g["tier"], g["gpu_hours"], g["usd"]) for g in est["gpus"]] == [("on_demand", 168, 336.0),
                                                                           ("spot", 168, 201.6)]
    assert est["gpu_usd"] == 537.6


def test_bench_result(tmp_path, capsys, prices):
    # Two requests over 4 s (first sent at 0 s, last done at 4 s): 400 input and 200 output tokens.
    recs = [RequestRecord(index=0, sent_s=0.0, ok=True, prompt_tokens=100, output_tokens=50, ttft_s=0.5,
                          e2e_s=2.0, finished_s=2.0),
            RequestRecord(index=1, sent_s=1.0, ok=True, prompt_tokens=300, output_tokens=150, ttft_s=0.5,
                          e2e_s=3.0, finished_s=4.0)]
    path = tmp_path / "bench.json"
    results.save(results.build({"slo_ms": {}}, [results.run_entry("rate 1", {"rate": 1.0}, recs, {})], {}), path)
    est = _run_json(capsys, ["cost", "--bench", str(path), "--gpu", "h100", "--gpus", "2", "--prices", prices,
                             "--period", "week"])
    # A week is 168 h / (4 s / 3600) = 151,200x the run: 2 GPUs x 168 h = 336 GPU-h x $2.00 = $672.
    assert est["gpu_hours"] == 336 and est["gpu_usd"] == 672.0
    assert est["traffic"]["input_tokens"] == 400 * 151_200 and est["traffic"]["requests"] == 2 * 151_200
    # Default split: 400 / (400 + 4 x 200) = 1/3 -> $224 over 60.48 Mtok = $3.7037/Mtok; $448 / 30.24 Mtok.
    assert est["input_share"] == pytest.approx(0.3333, abs=1e-4)
    assert est["usd_per_mtok_input"] == pytest.approx(3.7037, abs=1e-4)
    assert est["usd_per_mtok_output"] == pytest.approx(14.8148, abs=1e-4)


def test_rates_per_day_equal_rates_per_second(capsys, prices):
    # 86,400 tokens/day is 1 token/s.
    a = _run_json(capsys, ["cost", "--gpu", "L40S", "--gpus", "1", "--input-tokens-per-s", "2",
                           "--output-tokens-per-s", "1", "--prices", prices, "--input-share", "0.5"])
    b = _run_json(capsys, ["cost", "--gpu", "L40S", "--gpus", "1", "--input-tokens-per-day", "172800",
                           "--output-tokens-per-day", "86400", "--prices", prices, "--input-share", "0.5"])
    assert a["gpu_usd"] == b["gpu_usd"] == 730.0  # 730 h x $1.00
    # $365 over 2 tok/s x 730 h x 3600 s = 5.256 Mtok: $69.444/Mtok
    assert a["usd_per_mtok_input"] == b["usd_per_mtok_input"] == pytest.approx(69.4444, abs=1e-4)


@pytest.mark.parametrize("argv, message", [
    (["--tier", "monthly"], "unknown tier 'monthly'"),
    (["--tier", "on_demand=0.5,spot=0.2"], "sum to 1"),
    (["--utilization", "1.5"], "--utilization must be between 0 and 1"),
    (["--utilization", "0"], "--utilization must be above 0"),
    (["--gpu", "H100"], "--gpu/--gpus do not apply to --sim"),
    (["--api", "nobody"], "unknown API 'nobody'"),
    (["--salary", "-5"], "--salary must be a number >= 0"),
])
def test_bad_flags_exit_2_with_one_line(tmp_path, capsys, prices, argv, message):
    assert main(["cost", "--sim", _sim(tmp_path), "--prices", prices] + argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("argosy cost: error:") and err.count("\n") == 1


@pytest.mark.parametrize("argv, message", [
    ([], "give the traffic one way"),
    (["--input-tokens-per-s", "5"], "needs --gpu TYPE and --gpus N"),
    (["--input-tokens-per-s", "5", "--gpu", "H100", "--gpus", "1"], "give both the input and the output"),
    (["--gpu", "MI300X", "--gpus", "1", "--input-tokens-per-s", "5", "--output-tokens-per-s", "1"],
     "unknown GPU 'MI300X'; the price book has: H100, L40S"),
])
def test_missing_traffic_exit_2(capsys, prices, argv, message):
    assert main(["cost", "--prices", prices] + argv) == 2
    assert message in capsys.readouterr().err


def test_bad_result_files_exit_2(tmp_path, capsys, prices):
    bad = _sim(tmp_path)
    data = json.loads(open(bad).read())
    del data["token_time_split"]
    (tmp_path / "partial.json").write_text(json.dumps(data))
    assert main(["cost", "--sim", str(tmp_path / "partial.json"), "--prices", prices]) == 2
    assert "missing token_time_split" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("{not json")
    assert main(["cost", "--sim", str(tmp_path / "junk.json"), "--prices", prices]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert main(["cost", "--bench", bad, "--gpu", "H100", "--gpus", "1", "--prices", prices]) == 2
    assert "not an argosy bench results file" in capsys.readouterr().err
    assert main(["cost", "--sim", _sim(tmp_path, gpu_hours={"TPU": 1.0}), "--prices", prices]) == 2
    assert "unknown GPU 'TPU'" in capsys.readouterr().err
    for key in ("input_tokens", "output_tokens"):  # JSON numbers Python reads as inf and nan
        for text in ("1e400", "NaN"):
            (tmp_path / "odd.json").write_text(json.dumps(data | {"token_time_split": {"input": 0.5}})
                                               .replace(f'"{key}": ', f'"{key}": {text}, "was": '))
            assert main(["cost", "--sim", str(tmp_path / "odd.json"), "--prices", prices]) == 2
            err = capsys.readouterr().err
            assert f"{key} must be a finite number" in err and err.count("\n") == 1
