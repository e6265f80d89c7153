"""bench/gpu_check.py, the one script run on a lent GPU, kept working between those runs: its --cpu-smoke
mode takes the same steps on the CPU with a tiny model (its own engine, transformers on the same weights,
the roofline, a real replica's /metrics) and must produce a complete report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.fleet_fixtures import ROOT

pytest.importorskip("transformers")


def test_the_gpu_check_runs_end_to_end_on_the_cpu():
    out = subprocess.run([sys.executable, "bench/gpu_check.py", "--cpu-smoke", "--skip-tests"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads(out.stdout)
    assert report["errors"] == [], report["errors"]
    for side in ("argosy", "transformers"):
        assert set(report[side]["decode_tok_s"]) == {"1", "4"} and min(report[side]["decode_tok_s"].values()) > 0
        assert report[side]["prefill_tok_s"] > 0 and 0 < report[side]["ttft_s"] < 60
    assert report["argosy"]["attention_backend"] == "cpu_kernel"
    roof = report["roofline"]
    assert roof["copy_bandwidth_gb_s"] > 0 and roof["weight_bytes_per_step"] > 0 and roof["single_stream_tok_s"] > 0
    assert report["telemetry"]["ok"] and report["telemetry"]["missing"] == []
    targets = report["targets"]
    assert targets["no_out_of_memory"] and targets["telemetry_ok"] and targets["single_stream_vs_roofline"] > 0
    assert "progress" not in out.stdout and "[gpu_check" in out.stderr  # JSON alone on stdout, progress on stderr
