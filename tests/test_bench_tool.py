"""`argosy bench` against its streaming fixture server (a real HTTP server in a subprocess), plus unit
tests of the metrics, arrival process and workload on hand-computed values."""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from argosy.bench import results
from argosy.bench.arrivals import arrival_times
from argosy.bench.cli import add_bench_arguments, run_bench
from argosy.bench.metrics import max_rate_meeting_slos, parse_slos, summarize
from argosy.bench.progress import Progress
from argosy.bench.record import RequestRecord
from argosy.bench.workload import LengthDist, SyntheticWorkload

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fixture:
    """python -m argosy.bench.fixture_server on a free port; stop() ends it."""

    def __init__(self, *flags: str):
        self.url = f"http://127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "argosy.bench.fixture_server", "--port", self.url.rsplit(":", 1)[1], *flags]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("fixture server did not start")
            time.sleep(0.05)

    def stats(self) -> dict:
        return httpx.get(self.url + "/stats", timeout=5).json()

    def reset(self) -> None:
        httpx.post(self.url + "/stats/reset", timeout=5)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server():
    fx = Fixture("--ttft", "0.1", "--token-delay", "0.02")
    yield fx
    fx.stop()


def bench(tmp_path: Path, *argv: str) -> tuple[int, dict]:
    p = argparse.ArgumentParser()
    add_bench_arguments(p)
    out = tmp_path / "results.json"
    rc = run_bench(p.parse_args([*argv, "--output", str(out), "--model", "fixture"]))
    return rc, (json.loads(out.read_text()) if out.exists() else {})


# -- metrics on crafted records ------------------------------------------------------------------------

def rec(i: int, sent: float, chunks: list[float], ok: bool = True, kind: str | None = None,
        out_tokens: int | None = None, prompt_tokens: int = 10) -> RequestRecord:
    r = RequestRecord(index=i, sent_s=sent, ok=ok, error_kind=kind, chunk_times_s=chunks, prompt_tokens=prompt_tokens,
                      output_tokens=out_tokens if out_tokens is not None else len(chunks))
    if ok:
        r.ttft_s, r.e2e_s = chunks[0], chunks[-1]
    r.finished_s = sent + (chunks[-1] if chunks else 0.5)
    return r


def test_metrics_and_goodput_on_crafted_records():
    records = [
        rec(0, 0.0, [0.1, 0.2, 0.3]),  # TTFT 100 ms, TPOT (0.3-0.1)/2 = 100 ms, E2EL 300 ms
        rec(1, 1.0, [0.5, 0.6, 0.7, 0.8, 0.9]),  # TTFT 500 ms, TPOT 100 ms, E2EL 900 ms
        rec(2, 2.0, [0.2, 1.2]),  # TTFT 200 ms, TPOT 1000 ms
        rec(3, 3.0, [0.05]),  # one token: no TPOT (counts as 0 for goodput), E2EL 50 ms
        rec(4, 3.5, [], ok=False, kind="http_500"),
        rec(5, 3.6, [], ok=False, kind="timeout"),
        rec(6, 3.7, [], ok=False, kind="http_500"),
    ]
    slos = parse_slos("ttft=250ms,tpot=0.15s")
    assert slos == {"ttft": 250.0, "tpot": 150.0}
    s = summarize(records, slos)
    # duration: first send 0.0 to last end = max(3.0 + 0.05, 3.7 + 0.5) = 4.2 s
    assert s["duration_s"] == pytest.approx(4.2)
    assert (s["requests"], s["completed"], s["failed"]) == (7, 4, 3)
    assert s["errors"] == {"http_500": 2, "timeout": 1}
    assert s["ttft_ms"]["mean"] == pytest.approx((100 + 500 + 200 + 50) / 4)
    assert s["ttft_ms"]["p50"] == pytest.approx(150.0)
    assert s["tpot_ms"]["mean"] == pytest.approx((100 + 100 + 1000) / 3)  # the 1-token request has none
    itls = [100, 100, 100, 100, 100, 100, 1000]  # every gap, pooled
    assert s["itl_ms"]["mean"] == pytest.approx(sum(itls) / 7)
    assert s["itl_ms"]["p50"] == pytest.approx(100.0)
    assert s["e2el_ms"]["p99"] == pytest.approx(float(np.percentile([300, 900, 1200, 50], 99)))
    # Good: request 0 (100 ms, 100 ms) and request 3 (50 ms, TPOT 0); not 1 (TTFT), 2 (TPOT), failures.
    assert s["good_requests"] == 2
    assert s["goodput_rps"] == pytest.approx(2 / 4.2)
    assert s["slo_attainment"] == pytest.approx(2 / 7)
    assert s["request_throughput_rps"] == pytest.approx(4 / 4.2)
    assert s["output_throughput_tps"] == pytest.approx((3 + 5 + 2 + 1) / 4.2)
    assert s["input_throughput_tps"] == pytest.approx(40 / 4.2)
    assert summarize(records)["goodput_rps"] is None  # no SLOs, no goodput
    # e2e SLO alone: 300, 900, 1200, 50 ms against 1 s -> 3 good
    assert summarize(records, parse_slos("e2e=1s"))["good_requests"] == 3


def test_max_rate_meeting_slos_is_distserve_goodput():
    assert max_rate_meeting_slos([(1, 1.0), (2, 0.95), (4, 0.9), (8, 0.5)]) == 4
    assert max_rate_meeting_slos([(8, 0.95), (1, 1.0), (2, 0.8)]) == 1  # unsorted; a lucky 8 after a miss
    assert max_rate_meeting_slos([(1, 0.89)]) is None
    with pytest.raises(ValueError):
        parse_slos("latency=2s")


# -- arrivals and workload -------------------------------------------------------------------------------

def test_poisson_and_gamma_arrivals_have_the_configured_rate():
    t = np.array(list(arrival_times(10.0, seed=3, num=4000)))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)  # 4000 gaps: std of the mean ~1.6 %
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.08)  # exponential: CV 1
    g = np.diff(np.array(list(arrival_times(10.0, seed=3, num=4000, burstiness=4.0))))
    assert g.mean() == pytest.approx(0.1, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(0.5, abs=0.05)  # gamma shape 4: CV 1/sqrt(4)
    assert list(arrival_times(10.0, seed=3, num=50)) == list(arrival_times(10.0, seed=3, num=50))  # seeded
    within = list(arrival_times(10.0, seed=1, duration_s=30.0))
    assert max(within) <= 30.0 and len(within) == pytest.approx(300, rel=0.15)
    # A ramp 1 -> 9 req/s over 100 s: expect 500 arrivals, 30 % of them in the first half.
    ramp = np.array(list(arrival_times(0, seed=2, duration_s=100.0, ramp=(1.0, 9.0))))
    assert len(ramp) == pytest.approx(500, rel=0.1)
    assert (ramp < 50).mean() == pytest.approx(0.3, abs=0.05)


def test_length_distributions_and_synthetic_workload():
    import random

    rng = random.Random(0)
    u = [LengthDist(100, "uniform", 0.5).sample(rng) for _ in range(2000)]
    assert min(u) >= 50 and max(u) <= 150 and statistics.mean(u) == pytest.approx(100, rel=0.03)
    ln = [LengthDist(100, "lognormal", 0.5).sample(rng) for _ in range(4000)]
    assert statistics.mean(ln) == pytest.approx(100, rel=0.05)
    assert min(LengthDist(5, "normal", 2.0).sample(rng) for _ in range(500)) >= 1
    wl = SyntheticWorkload(LengthDist(12), LengthDist(3), seed=1, turns=2, shared_prefix_tokens=8, num_prefixes=2)
    jobs = list(wl.jobs(5))
    assert [len(j.turns) for j in jobs] == [2, 2, 1]  # 5 requests in all
    assert all(len(t.text.split()) == 12 for j in jobs for t in j.turns)
    assert {j.system for j in jobs} <= set(wl.prefixes) and len(wl.prefixes) == 2
    assert [t.text for j in wl.jobs(5) for t in j.turns] == [t.text for j in jobs for t in j.turns]  # seeded


def test_progress_line_has_units():
    p = Progress("rate 4 req/s", total=100, duration_s=None, enabled=False)
    p.request_started()
    p.request_done(ok=False)
    line = p.line()
    assert "1/100 requests" in line and "req/s" in line and "1 errors" in line and " s" in line


# -- against the fixture server ---------------------------------------------------------------------------

def test_measured_ttft_itl_throughput_match_the_fixture(server, tmp_path):
    server.reset()
    rc, res = bench(tmp_path, "--url", server.url, "--concurrency", "4", "--num-requests", "24",
                    "--prompt-tokens", "20", "--output-tokens", "10")
    assert rc == 0
    s = res["runs"][0]["summary"]
    assert s["completed"] == 24
    # fixture: TTFT 100 ms, then a token every 20 ms; E2EL 100 + 9 * 20 = 280 ms
    assert 95 <= s["ttft_ms"]["p50"] <= 125
    assert 18 <= s["itl_ms"]["p50"] <= 23
    assert s["tpot_ms"]["mean"] == pytest.approx(20, rel=0.15)
    assert s["e2el_ms"]["p50"] == pytest.approx(280, rel=0.1)
    # 4 in flight, 280 ms each: ~14.3 req/s, 10 output tokens each; usage gives the prompt tokens
    assert s["request_throughput_rps"] == pytest.approx(4 / 0.28, rel=0.2)
    assert s["output_throughput_tps"] == pytest.approx(10 * s["request_throughput_rps"])
    assert s["total_input_tokens"] == 24 * 20
    # closed loop: never more than 4 in flight, at the server or by the records
    assert server.stats()["max_in_flight"] == 4
    assert s["peak_in_flight"] <= 4


def test_each_run_counts_the_clients_cpu_without_its_start(server, tmp_path):
    import resource

    def children_cpu_s() -> float:
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime

    out = tmp_path / "cpu.json"
    cpu0 = children_cpu_s()
    done = subprocess.run([sys.executable, "-m", "argosy.cli", "bench", "--url", server.url, "--model", "fixture",
                           "--rate", "inf,inf", "--num-requests", "40", "--prompt-tokens", "5", "--output-tokens", "8",
                           "--no-progress", "-o", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    whole = children_cpu_s() - cpu0
    assert done.returncode == 0, done.stderr
    runs = json.loads(out.read_text())["runs"]
    counted = [r["client_cpu_s"] for r in runs]
    # Each run's own CPU (40 streamed requests: tens of milliseconds), none of the interpreter's start and
    # imports (a good part of the process's CPU), which a server sharing the machine never competed with.
    assert all(0 < c for c in counted) and sum(counted) < whole - 0.2
    assert done.stdout.count("Client CPU:") == 2
    # A share of a core only over a run long enough to say one: a 4 ms run had printed "263 % of a core".
    shares = [int(x) for x in re.findall(r"\((\d+) % of a core\)", done.stdout)]
    durations = [r["summary"]["duration_s"] for r in runs]
    assert len(shares) == sum(d >= 1 for d in durations) and all(x <= 100 for x in shares), (shares, durations)


def test_open_loop_sends_on_schedule(server, tmp_path):
    rc, res = bench(tmp_path, "--url", server.url, "--rate", "40", "--num-requests", "60", "--seed", "7",
                    "--prompt-tokens", "5", "--output-tokens", "2")
    assert rc == 0
    recs = res["runs"][0]["records"]
    expected = list(arrival_times(40.0, seed=8, num=60))  # the runner seeds arrivals with seed + 1
    assert [r["scheduled_s"] for r in recs] == pytest.approx(expected, abs=1e-6)
    lags = sorted(r["sent_s"] - r["scheduled_s"] for r in recs)
    # Never early; late by scheduler noise only (the test machine is shared), not by waiting for answers
    # (each takes ~110 ms: awaiting them in turn would put the last request seconds behind).
    assert lags[0] >= 0 and lags[len(lags) // 2] < 0.02 and lags[-1] < 0.25
    assert res["runs"][0]["summary"]["peak_in_flight"] > 4  # open loop: overlapping, not one at a time


def test_errors_are_counted_by_kind(tmp_path):
    fx = Fixture("--ttft", "0.01", "--token-delay", "0.005", "--pattern", "ok,500,429,drop")
    try:
        rc, res = bench(tmp_path, "--url", fx.url, "--concurrency", "1", "--num-requests", "8",
                        "--output-tokens", "6")
    finally:
        fx.stop()
    assert rc == 0
    s = res["runs"][0]["summary"]
    assert (s["completed"], s["failed"]) == (2, 6)
    assert s["errors"] == {"connection": 2, "http_429": 2, "http_500": 2}
    # and why, as the server put it (its code; never its message, which may quote the prompt)
    assert s["error_examples"]["http_429"] == "HTTP 429 Too Many Requests: fixture_429"
    assert "fixture error" not in json.dumps(res)


def test_chat_sessions_resend_history_with_shared_prefixes(server, tmp_path):
    rc, res = bench(tmp_path, "--url", server.url, "--endpoint", "chat", "--concurrency", "2", "--num-requests", "6",
                    "--turns", "3", "--shared-prefix-tokens", "20", "--num-prefixes", "2",
                    "--prompt-tokens", "10", "--output-tokens", "3")
    assert rc == 0
    recs = res["runs"][0]["records"]
    # The fixture counts words: prefix 20 + 10 new per turn + the 3-word replies of earlier turns.
    assert sorted((r["session"], r["turn"], r["prompt_tokens"]) for r in recs) == [
        (s, t, 20 + 10 * (t + 1) + 3 * t) for s in (0, 1) for t in range(3)]
    assert all(r["ok"] and r["output_tokens"] == 3 for r in recs)
    # chat's role-only first chunk carries no token: TTFT is the fixture's 100 ms, not ~0
    assert min(r["ttft_s"] for r in recs) > 0.09


def test_trace_replay_sends_at_the_trace_timestamps(server, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(d) for d in [
        {"timestamp": 10.0, "prompt": "one two three", "output_tokens": 2},
        {"timestamp": 10.3, "prompt_tokens": 7, "output_tokens": 3},
        {"timestamp": 10.6, "prompt_tokens": 5}]))
    rc, res = bench(tmp_path, "--url", server.url, "--trace", str(trace), "--output-tokens", "4")
    assert rc == 0
    recs = res["runs"][0]["records"]
    assert [r["scheduled_s"] for r in recs] == pytest.approx([0.0, 0.3, 0.6])
    assert [r["sent_s"] for r in recs] == pytest.approx([0.0, 0.3, 0.6], abs=0.1)
    assert [(r["prompt_tokens"], r["output_tokens"]) for r in recs] == [(3, 2), (7, 3), (5, 4)]


def test_results_round_trip_through_report_and_html(server, tmp_path, capsys):
    html = tmp_path / "report.html"
    rc, res = bench(tmp_path, "--url", server.url, "--rate", "20,40", "--num-requests", "10",
                    "--prompt-tokens", "8", "--output-tokens", "3", "--slo", "ttft=150ms,tpot=50ms",
                    "--html", str(html))
    assert rc == 0
    printed = capsys.readouterr().out
    assert res["config"]["slo_ms"] == {"ttft": 150.0, "tpot": 50.0} and len(res["runs"]) == 2
    assert res["sweep"]["max_rate_meeting_slos"] == 40  # an unloaded fixture meets these at both rates
    # `report` recomputes the summaries from the records: the same numbers, the same text
    p = argparse.ArgumentParser()
    add_bench_arguments(p)
    assert run_bench(p.parse_args(["report", str(tmp_path / "results.json")])) == 0
    reported = capsys.readouterr().out
    for run in res["runs"]:
        assert results.render_run(run) in printed and results.render_run(run) in reported
    reloaded = results.load(tmp_path / "results.json")
    for before, after in zip(res["runs"], reloaded["runs"], strict=True):
        assert flatten(after["summary"]) == pytest.approx(flatten(before["summary"]), rel=1e-4, abs=1e-3)
    page = html.read_text()
    assert page.count("<svg") == 2 * 5 + 3  # per run: latency, throughput, 3 CDFs; sweep: 3 charts
    for title in ("Latency over time", "CDF of TTFT", "CDF of ITL", "CDF of E2EL", "Throughput and goodput vs rate"):
        assert title in page
    assert "<polyline" in page and "<script" not in page and "<link" not in page and 'src="' not in page


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


@pytest.mark.parametrize("flags, message", [
    (["--concurrency", "0"], "--concurrency must be at least 1, got 0"),  # had run one stream, rc 0
    (["--concurrency", "2,-2"], "--concurrency must be at least 1, got -2"),
    (["--rate", "5", "--duration", "nan"], "--duration must be a finite number > 0"),  # had never ended
    (["--rate", "5", "--duration", "-1"], "--duration must be a finite number > 0"),
    (["--rate", "nan"], "--rate must be a number > 0"),
    (["--rate", "5", "--num-requests", "0"], "--num-requests must be at least 1"),
    (["--rate", "5", "--max-connections", "-1"], "--max-connections must be at least 0"),  # had hung
    (["--rate", "5", "--timeout", "0"], "--timeout must be a finite number > 0"),
    (["--rate", "5", "--trace-speedup", "0"], "--trace-speedup must be a finite number > 0"),
    (["--ramp", "0:0", "--num-requests", "2"], "--ramp 0:0 sends nothing"),  # had been a ZeroDivisionError
    (["--trace", "no-such-trace.jsonl"], "No such file"),  # the file's mistake, not the server's
])
def test_unusable_numbers_are_refused_before_the_server_is_asked(tmp_path, capsys, flags, message):
    with socket.socket() as s:  # nobody listens here: a flag checked late would say "cannot reach"
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    rc, res = bench(tmp_path, "--url", url, "--no-progress", *flags)
    err = capsys.readouterr().err
    assert rc == 2 and res == {}
    assert message in err and err.startswith("argosy bench: error:") and err.count("\n") == 1


def test_ctrl_c_keeps_and_reports_what_finished(tmp_path):
    import signal

    fx = Fixture("--ttft", "0.02", "--token-delay", "0.01")
    out = tmp_path / "partial.json"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "argosy.cli", "bench", "--url", fx.url, "--model", "fixture",
                                 "--rate", "20", "--duration", "120", "--output-tokens", "20", "--no-progress",
                                 "-o", str(out)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(4)  # a few dozen requests done, a few in flight
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends: the whole group
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        fx.stop()
    assert proc.returncode == 130 and "Traceback" not in stderr
    assert "Interrupted (Ctrl-C)" in stdout and f"results: {out}" in stdout  # had exited with nothing written
    run = json.loads(out.read_text())["runs"][0]
    assert run["summary"]["completed"] >= 10 and run["summary"]["failed"] == 0
    assert run["interrupted"]["in_flight"] >= 0 and all(r["ok"] for r in run["records"])
