"""The simulator's GPU roofline against published results: fitted on one figure per GPU, predicting the rest.

    .venv/bin/python bench/sim_published.py [--only mlperf] [--quick] [--one-kernel] [-o published.json]

For each GPU (H100, H200) the roofline's compute efficiency is fitted on ONE figure: MLPerf Inference v4.1
Llama-2-70B Offline (a 1-D search: efficiency x published / predicted until within 0.5%). Everything else
(memory efficiency 0.7, 3 ms per step, 0.5 ms per extra TP rank, 90% of memory) keeps the roofline's
defaults. Then every other figure in bench/published_figures.py is predicted without refitting, by running
`argosy sim`'s FleetSim on the published workload: offline = every request at t=0 (MLPerf: its steady state,
its runs last 40 minutes; others: output tokens over the makespan, as their tools report); server = Poisson
arrivals at the published rate. Replicas of a data-parallel system are independent (offline) or share the
arrivals (server), so one replica is simulated at 1/replicas of the rate and its throughput multiplied.
`--one-kernel` predicts with the older profile shape, base + max(compute, memory) over the whole step.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from published_figures import FIGURES, WORKLOADS, Figure  # noqa: E402

SERVER_S, WARMUP_S = 600.0, 300.0  # MLPerf server: simulated seconds, and the warm-up left out (mean E2E ~45 s)


def lengths(n: int, mean: float, lo: int, hi: int, sigma: float, rng: np.random.Generator) -> list[int]:
    """Lognormal token counts clipped to [lo, hi], rescaled so that their mean stays `mean`."""
    if sigma == 0:
        return [round(mean)] * n
    raw, scale = rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, n), 1.0
    for _ in range(50):
        x = np.clip(raw * scale, lo, hi)
        if abs(x.mean() - mean) < 1e-4 * mean:
            break
        scale *= mean / x.mean()
    return [max(lo, int(v)) for v in np.rint(x)]


def make_requests(fig: Figure, arrivals: list[float], seed: int = 0):
    from argosy.sim.traffic import Requests

    w, n, rng = WORKLOADS[fig.workload], len(arrivals), np.random.default_rng(seed)
    return Requests(arrivals, [0] * n, lengths(n, w.input_mean, *w.input_range, w.sigma, rng),
                    lengths(n, w.output_mean, *w.output_range, w.sigma, rng), [-1] * n)


def profile(fig: Figure, compute_eff: float, one_kernel: bool = False):
    from argosy.sim.profile import RooflineSettings, model_shape, roofline_profile

    prof = roofline_profile(fig.gpu, model_shape(fig.model), fig.tp,
                            RooflineSettings(compute_efficiency=compute_eff, dtype=fig.dtype))
    return replace(prof, combine="max", per_prefill_attn_s=0.0) if one_kernel else prof


def batch_limit(fig: Figure, prof) -> int:
    if "no-evict" not in fig.note:
        return fig.max_num_seqs
    w = WORKLOADS[fig.workload]  # a scheduler that reserves each request's whole KV when it admits it
    return max(1, min(fig.max_num_seqs, prof.num_blocks // math.ceil((w.input_mean + w.output_mean) / prof.block_size)))


def simulate(fig: Figure, prof, quick: bool = False) -> dict:
    """The figure's metric (and the others of its run) predicted for the whole published system."""
    from argosy.config import ModelConfig
    from argosy.sim.fleet import FleetSim, SimSettings
    from argosy.sim.results import latencies
    from argosy.sim.traffic import TrafficSpec

    model = ModelConfig(name=fig.model, engine={"max_num_seqs": batch_limit(fig, prof),
                                                "max_num_batched_tokens": fig.token_budget})
    mlperf = fig.key.startswith("mlperf")
    if fig.rate == 0:  # offline: everything at once
        n = fig.requests // (2 if quick and mlperf else 1)
        arrivals = [0.0] * n
    else:
        rate = fig.rate / fig.replicas
        rng = np.random.default_rng(1)
        if mlperf:
            duration = SERVER_S / (2 if quick else 1)
            count = int(rate * duration * 1.2) + 50
        else:  # SGLang's bench_serving: 300 s of requests (1,200 at 4 req/s, 2,400 at 8)
            count = int(round(rate * 300))
        arrivals = np.cumsum(rng.exponential(1 / rate, count)).tolist()
        if mlperf:
            arrivals = [t for t in arrivals if t < duration]
    reqs = make_requests(fig, arrivals)
    sim = FleetSim(model, prof, TrafficSpec(duration_s=max(arrivals[-1], 1e-3)), reqs,
                   SimSettings(replicas=1, drain_limit_s=1e7, sample_s=60.0))
    sim.run()
    done = sorted(sim.done, key=lambda r: r.finish_s)
    out: dict = {"requests": len(reqs), "finished": len(done), "batch_limit": model.engine.max_num_seqs}
    if fig.rate == 0 and mlperf:  # MLPerf's 40-minute runs: the steady state, between 25% and 85% done
        lo, hi = int(0.25 * len(done)), int(0.85 * len(done))
        span = done[hi].finish_s - done[lo].finish_s
        out["output_tok_s"] = sum(r.output_tokens for r in done[lo:hi]) / span * fig.replicas
    elif fig.rate == 0:
        out["output_tok_s"] = sum(r.output_tokens for r in done) / done[-1].finish_s * fig.replicas
    else:
        warm = WARMUP_S / (2 if quick else 1) if mlperf else 0.0
        end = arrivals[-1]
        window = [r for r in done if warm <= r.arrival_s <= end]
        ttft, tpot, _ = latencies(sim, window)
        for name, vals in (("ttft", ttft), ("tpot", tpot)):
            out[f"{name}_p50_s"], out[f"{name}_p99_s"] = (float(np.percentile(vals, q)) for q in (50, 99))
        fin = [r for r in done if warm <= r.finish_s <= end]
        out["output_tok_s"] = sum(r.output_tokens for r in fin) / (end - warm) * fig.replicas
        out["preemptions"] = sum(r.preemptions for r in done)
    return out


def fit_gpu(fig: Figure, one_kernel: bool, quick: bool, log) -> float:
    """Compute efficiency that makes the simulator reproduce `fig` (throughput grows with it, nearly in proportion)."""
    eff = 0.5
    for _ in range(8):
        got = simulate(fig, profile(fig, eff, one_kernel), quick)["output_tok_s"]
        log(f"fit {fig.gpu} on {fig.key}: compute efficiency {eff:.4f} -> {got:,.0f} tok/s "
            f"(published {fig.published:,.0f}, {100 * (got / fig.published - 1):+.1f}%)")
        if abs(got / fig.published - 1) < 0.005:
            return eff
        eff = min(1.0, eff * fig.published / got)
    return eff


def show(value: float, metric: str) -> str:
    return f"{value:,.0f} tok/s" if metric == "output_tok_s" else f"{value * 1e3:,.1f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="predict only figures whose key contains this (fits still run)")
    ap.add_argument("--effs", default="", help="skip fitting: H100=0.4,H200=0.45 (compute efficiencies)")
    ap.add_argument("--one-kernel", action="store_true", help="the older profile: base + max(compute, memory)")
    ap.add_argument("--quick", action="store_true", help="half the MLPerf requests and server seconds")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/sim.md)")
    ap.add_argument("-o", "--output", default=None, help="write every figure and prediction as JSON here")
    args = ap.parse_args()
    t0 = time.monotonic()
    log = lambda m: print(f"[{time.monotonic() - t0:6.0f} s] {m}", flush=True)  # noqa: E731
    effs = {k: float(v) for k, v in (kv.split("=") for kv in args.effs.split(",") if kv)}
    for fig in (f for f in FIGURES if f.fit and f.gpu not in effs):
        effs[fig.gpu] = fit_gpu(fig, args.one_kernel, args.quick, log)
    log("fitted: " + ", ".join(f"{g} compute efficiency {e:.4f} (memory 0.7, 3 ms/step)" for g, e in effs.items()))
    rows = []
    todo = [f for f in FIGURES if args.only in f.key]
    for i, fig in enumerate(todo, 1):
        same = next((r for r in rows if r["run"] == _run_key(fig)), None)  # metrics of one run share it
        pred = same["prediction"] if same else simulate(fig, profile(fig, effs[fig.gpu], args.one_kernel), args.quick)
        value = pred[fig.metric]
        rows.append({"run": _run_key(fig), "figure": asdict(fig), "prediction": pred, "predicted": value,
                     "error": value / fig.published - 1, "compute_efficiency": effs[fig.gpu]})
        log(f"{i}/{len(todo)} {fig.key}: published {show(fig.published, fig.metric)}, predicted "
            f"{show(value, fig.metric)} ({100 * (value / fig.published - 1):+.1f}%)")
    (print_markdown if args.markdown else print_table)(rows, effs, args.one_kernel)
    if args.output:
        Path(args.output).write_text(json.dumps({"compute_efficiency": effs, "one_kernel": args.one_kernel,
                                                 "rows": rows}, indent=1))
    return 0


def _run_key(fig: Figure) -> tuple:
    return (fig.system, fig.workload, fig.rate, fig.requests)


def print_table(rows: list[dict], effs: dict, one_kernel: bool) -> None:
    print(f"\nroofline ({'one kernel: max(compute, memory)' if one_kernel else 'split: matmuls + attention'}); "
          + ", ".join(f"{g}: compute efficiency {e:.3f} fitted" for g, e in effs.items()))
    print(f"{'figure':<34}{'metric':<14}{'published':>14}{'predicted':>14}{'error':>9}  note")
    groups: dict[str, list[float]] = {}
    for r in rows:
        f = r["figure"]
        note = "FITTED" if f["fit"] else f["note"]
        if f["limit"] is not None:
            note = f"limit {f['limit'] * 1e3:.0f} ms: {'met' if r['predicted'] <= f['limit'] else 'MISSED'}" + (
                f"; {note}" if note else "")
        print(f"{f['key'][:33]:<34}{f['metric']:<14}{show(f['published'], f['metric']):>14}"
              f"{show(r['predicted'], f['metric']):>14}{100 * r['error']:>+8.1f}%  {note}")
        if not f["fit"]:
            groups.setdefault(f["key"].split("-")[0], []).append(abs(r["error"]))
    every = [e for errs in groups.values() for e in errs]
    if every:
        print(f"median |error| of {len(every)} predictions: {100 * float(np.median(every)):.1f}% (target <= 20%); "
              + ", ".join(f"{g} {100 * float(np.median(e)):.1f}% ({len(e)})" for g, e in groups.items()))
    print("sources:")
    for src in sorted({r["figure"]["source"] for r in rows}):
        print(f"  {src}")


def print_markdown(rows: list[dict], effs: dict, one_kernel: bool) -> None:
    labels: dict[str, str] = {}
    print("| scenario | metric | source | published | predicted | error |\n|---|---|---|---|---|---|")
    for r in rows:
        f = r["figure"]
        label = labels.setdefault(f["source"], f"[{len(labels) + 1}]")
        err = "fitted" if f["fit"] else f"{100 * r['error']:+.1f}%"
        limit = "" if f["limit"] is None else f" ({'meets' if r['predicted'] <= f['limit'] else 'misses'} "\
                                                f"{f['limit'] * 1e3:.0f} ms)"
        print(f"| {f['system']} | {f['metric']} | {label} | {show(f['published'], f['metric'])} | "
              f"{show(r['predicted'], f['metric'])}{limit} | {err} |")
    errs = [abs(r["error"]) for r in rows if not r["figure"]["fit"]]
    print(f"\nMedian |error| of {len(errs)} predictions: {100 * float(np.median(errs)):.1f}%; compute efficiency "
          + ", ".join(f"{g} {e:.3f}" for g, e in effs.items()) + (" (one-kernel roofline)" if one_kernel else ""))
    for src, label in labels.items():
        print(f"{label} {src}")


if __name__ == "__main__":
    sys.exit(main())
