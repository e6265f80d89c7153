"""What serving adds to the engine's own step times: measured on a real `argosy engine` replica.

`measure_profile` times LLMEngine.step in-process. A served replica does more: the HTTP request,
tokenization and the first SSE chunk (before and after the engine's queue), and per step the hand-off
of outputs to the event loop and one SSE chunk per sequence, which share the GIL with the engine
thread. Both are measured here, on the replica a user would run, with `argosy bench`:

- bursts of c requests at once (c = 1, 4, 16, ...): after the prefills, every step decodes c
  sequences, so the time per output token of the burst's last-served request is one served decode
  step at batch c. Its excess over the profile's prediction, fitted as `a + b * c`, is the
  profile's `serving_step_s` and `serving_per_seq_s`;
- the time to first token of lone requests (one after the other), less the profile's prefill step,
  is what a request pays outside the engine: its median is `request_s`, and its spread (20
  quantiles) is what the sim draws from for each request's TTFT and end-to-end latency.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np

from argosy.sim.profile import StepProfile

BURSTS = (1, 4, 16, 32, 64)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the replica exited (code {proc.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the replica was not ready within {timeout_s:.0f} s")


def _bench(url: str, load: list[str], n: int, prompt_tokens: int, output_tokens: int, out: Path) -> list[dict]:
    subprocess.run([sys.executable, "-m", "argosy.cli", "bench", "--url", url, *load,
                    "--num-requests", str(n), "--prompt-tokens", str(prompt_tokens), "--output-tokens",
                    str(output_tokens), "--seed", str(n), "--no-progress", "-o", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    records = json.loads(out.read_text())["runs"][0]["records"]
    ok = [r for r in records if r["ok"] and r["output_tokens"] > 1]
    if len(ok) < len(records):
        raise RuntimeError(f"{len(records) - len(ok)} of {len(records)} requests failed while measuring the replica")
    return ok


def measure_serving(model: str, prof: StepProfile, *, max_num_seqs: int, token_budget: int,
                    kv_cache_memory_gib: float, prompt_tokens: int = 128, output_tokens: int = 64,
                    repeats: int = 2, lone_requests: int = 30, log: Callable[[str], None] = print) -> StepProfile:
    """`prof` (from measure_profile on the same checkpoint and limits) with the serving overheads added."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "argosy.cli", "engine", "--model", model, "--port", str(port),
                             "--device", "cpu", "--max-num-seqs", str(max_num_seqs), "--max-num-batched-tokens",
                             str(token_budget), "--kv-cache-memory", str(kv_cache_memory_gib)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    excess: list[tuple[int, float]] = []  # (batch, served step - predicted step)
    ttft_over: list[float] = []
    try:
        wait_ready(url, proc)
        with tempfile.TemporaryDirectory(prefix="argosy-serving-") as tmp:
            for c in [b for b in BURSTS if b <= max_num_seqs]:
                for k in range(repeats + 1):
                    recs = _bench(url, ["--rate", "inf"], c, prompt_tokens, output_tokens, Path(tmp) / f"b{c}-{k}.json")
                    if k == 0:
                        continue  # warm-up
                    last = max(recs, key=lambda r: r["ttft_s"])  # decodes after every prefill of the burst
                    tpot = (last["e2e_s"] - last["ttft_s"]) / (last["output_tokens"] - 1)
                    kv = sum(r["prompt_tokens"] + r["output_tokens"] / 2 for r in recs)
                    excess.append((c, tpot - prof.step_s(0, c, int(kv))))
                median = statistics.median(e for b, e in excess if b == c)
                log(f"served decode steps at batch {c}: {1e3 * median:+.2f} ms beside the engine's own")
            # Lone requests one after the other: what a request pays outside the engine, and how it spreads.
            for r in _bench(url, ["--concurrency", "1"], lone_requests, prompt_tokens, output_tokens,
                            Path(tmp) / "lone.json"):
                p = r["prompt_tokens"]
                ttft_over.append(max(r["ttft_s"] - prof.step_s(p, 0, p, p * (p + 1) // 2), 0.0))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    x = np.array([[1.0, c] for c, _ in excess])
    y = np.array([e for _, e in excess])
    a, b = (max(float(v), 0.0) for v in np.linalg.lstsq(x, y, rcond=None)[0])
    request_s = statistics.median(ttft_over)
    quantiles = tuple(float(v) for v in np.quantile(ttft_over, np.linspace(0.025, 0.975, 20)))
    log(f"serving: {a * 1e3:.3f} ms per step + {b * 1e6:.1f} us per streamed sequence; "
        f"{request_s * 1e3:.2f} ms per request (HTTP, tokenization, first chunk; p90 {quantiles[-3] * 1e3:.2f} ms)")
    return dataclasses.replace(
        prof, name=prof.name.replace("(measured)", "(measured, served)"), serving_step_s=a, serving_per_seq_s=b,
        request_s=request_s, request_s_quantiles=quantiles,
        notes={**prof.notes, "serving": {"step_s": a, "per_seq_s": b, "request_s": request_s,
                                         "observations": [list(o) for o in excess]}})
