"""What serving adds to the engine's own step times: measured on a real `argosy engine` replica.

`measure_profile` times LLMEngine.step in-process. A served replica does more: the HTTP request,
tokenization and the first SSE chunk (before and after the engine's queue), and per step the hand-off
of outputs to the event loop and one SSE chunk per sequence, which share the GIL with the engine
thread. Both are measured here, on the replica a user would run, with `argosy bench`:

- bursts of c requests at once (c = 1, 4, 16, ...): the burst's last-served request decodes after
  every prefill of the burst, beside the others until they finish (they started earlier, so they end
  earlier). Its time per output token, against the profile's step at the mean batch it actually
  decoded in (from the others' decode windows), is what serving adds per step at that batch;
- lone requests (one after the other) add many samples at batch 1, the batch of light traffic.
  The medians by burst size are the profile's `serving_table`;
- the time to first token of the lone requests, less the profile's prefill step, is what a request
  pays outside the engine: its median is `request_s`, and its spread (20 quantiles) is what the sim
  draws from for each request's TTFT and end-to-end latency.
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


def _bench(url: str, load: list[str], n: int, prompt_tokens: int, output_tokens: int, out: Path) -> list[list[dict]]:
    """The records of each run (one per level of `load`) of n requests."""
    subprocess.run([sys.executable, "-m", "argosy.cli", "bench", "--url", url, *load,
                    "--num-requests", str(n), "--prompt-tokens", str(prompt_tokens), "--output-tokens",
                    str(output_tokens), "--seed", str(n), "--no-progress", "-o", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    runs = []
    for run in json.loads(out.read_text())["runs"]:
        ok = [r for r in run["records"] if r["ok"] and r["output_tokens"] > 1]
        if len(ok) < len(run["records"]):
            raise RuntimeError(f"{len(run['records']) - len(ok)} of {len(run['records'])} requests failed while "
                               "measuring the replica")
        runs.append(ok)
    return runs


def _decode_window(r: dict) -> tuple[float, float]:
    return r["sent_s"] + r["ttft_s"], r["sent_s"] + r["e2e_s"]


def _served_step(recs: list[dict], prof: StepProfile) -> tuple[float, float]:
    """(mean decode batch, served step - the profile's step at that batch) for a burst's last-served request."""
    last = max(recs, key=lambda r: r["sent_s"] + r["ttft_s"])
    t0, t1 = _decode_window(last)
    others = sum(max(0.0, min(t1, b) - max(t0, a)) for a, b in map(_decode_window, recs) if a < t1 and b > t0)
    batch = others / (t1 - t0)  # time-weighted, the last request included (its own window counts fully)
    tpot = (last["e2e_s"] - last["ttft_s"]) / (last["output_tokens"] - 1)
    kv = batch * (last["prompt_tokens"] + last["output_tokens"] / 2)
    return batch, tpot - prof.step_s(0, batch, int(kv))


def measure_serving(model: str, prof: StepProfile, *, max_num_seqs: int, token_budget: int,
                    kv_cache_memory_gib: float, prompt_tokens: int = 128, output_tokens: int = 64,
                    repeats: int = 9, lone_requests: int = 30, log: Callable[[str], None] = print) -> StepProfile:
    """`prof` (from measure_profile on the same checkpoint and limits) with the serving overheads added."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "argosy.cli", "engine", "--model", model, "--port", str(port),
                             "--device", "cpu", "--max-num-seqs", str(max_num_seqs), "--max-num-batched-tokens",
                             str(token_budget), "--kv-cache-memory", str(kv_cache_memory_gib)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    groups: dict[int, list[tuple[float, float]]] = {}  # burst size -> (mean decode batch, excess) samples
    try:
        wait_ready(url, proc)
        with tempfile.TemporaryDirectory(prefix="argosy-serving-") as tmp:
            for c in [b for b in BURSTS if b <= max_num_seqs]:
                # One bench for all the bursts of a size (its start, a second of CPU, paid once); the first
                # burst is a warm-up. A burst's sample is one request, so take many: each is about a second.
                bursts = _bench(url, ["--rate", ",".join(["inf"] * (repeats + 1))], c, prompt_tokens, output_tokens,
                                Path(tmp) / f"b{c}.json")
                groups[c] = [_served_step(recs, prof) for recs in bursts[1:]]
                batch, excess = (statistics.median(v) for v in zip(*groups[c], strict=True))
                log(f"served decode steps at batch {batch:.1f}: {1e3 * excess:+.2f} ms beside the engine's own")
            # Lone requests one after the other: what a request pays outside the engine, and how it spreads.
            [lone] = _bench(url, ["--concurrency", "1"], lone_requests, prompt_tokens, output_tokens,
                            Path(tmp) / "lone.json")
            groups.setdefault(1, []).extend(_served_step([r], prof) for r in lone)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    table = tuple(sorted({round(statistics.median(b for b, _ in v), 2): statistics.median(e for _, e in v)
                          for v in groups.values()}.items()))  # one entry per batch
    served = dataclasses.replace(prof, serving_table=table)
    # Against the served prefill step, so that the sim, which adds both, does not count serving twice.
    ttft_over = [max(r["ttft_s"] - served.step_s(p, 0, p, p * (p + 1) // 2), 0.0)
                 for r in lone for p in [r["prompt_tokens"]]]
    request_s = statistics.median(ttft_over)
    quantiles = tuple(float(v) for v in np.quantile(ttft_over, np.linspace(0.025, 0.975, 20)))
    log("serving adds per decode step: " + ", ".join(f"{e * 1e3:+.2f} ms at batch {b:g}" for b, e in table)
        + f"; {request_s * 1e3:.2f} ms per request (HTTP, tokenization, first chunk; p90 {quantiles[-3] * 1e3:.2f} ms)")
    return dataclasses.replace(
        served, name=prof.name.replace("(measured)", "(measured, served)"), request_s=request_s,
        request_s_quantiles=quantiles,
        notes={**prof.notes, "serving": {"table": [list(t) for t in table], "request_s": request_s,
                                         "observations": {str(c): [list(o) for o in v] for c, v in groups.items()}}})


def average_serving(a: StepProfile, b: StepProfile) -> StepProfile:
    """The mean of two serving measurements of one engine profile (taken before and after a run, so that
    a machine whose speed drifts is compared with its speed across the run, not at one end of it)."""
    if len(a.serving_table) != len(b.serving_table):
        raise ValueError("the two serving measurements have different burst sizes")
    table = tuple(((x0 + x1) / 2, (y0 + y1) / 2) for (x0, y0), (x1, y1) in zip(a.serving_table, b.serving_table,
                                                                               strict=True))
    quantiles = tuple((x + y) / 2 for x, y in zip(a.request_s_quantiles, b.request_s_quantiles, strict=True))
    return dataclasses.replace(a, serving_table=table, request_s=(a.request_s + b.request_s) / 2,
                               request_s_quantiles=quantiles,
                               notes={**a.notes, "serving": [a.notes["serving"], b.notes["serving"]]})
