"""A week planned from its distinct hourly load levels, each simulated once, results weighted by hours.

Each hour's mean rate (the traffic curve averaged over the hour) is rounded to a step of
`level_step` x the peak; hours with the same rounded rate and the same failed regions share one
simulation of `level_s` seconds at that constant rate. In the first `warmup_s` (excluded from latencies)
new replicas start at once, so the level is measured in the steady state the autoscaler reaches over the
hours a diurnal curve takes; a failed region goes down when the warm-up ends, so its failover is measured
with cold starts.
GPU-hours and tokens scale by the hours each level stands for; latency percentiles are the
hour-weighted mean of the levels' percentiles, attainment the request-weighted mean.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from argosy.config import ModelConfig
from argosy.sim.fleet import FleetSim, SimSettings
from argosy.sim.profile import StepProfile
from argosy.sim.results import SLO, summarize
from argosy.sim.traffic import Failure, TrafficSpec, make_requests
from argosy.sim.workers import spawn_context, start_worker, worker_count

HOURS = 168


@dataclass(frozen=True)
class Level:
    rate: float  # req/s, constant over the level's simulation
    down: tuple[str, ...]  # failed regions
    hours: list[int]  # which hours of the week it stands for


def hourly_levels(spec: TrafficSpec, level_step: float = 0.05) -> list[Level]:
    ts = np.arange(HOURS * 60) * 60.0 + 30.0  # minute midpoints
    per_minute = spec.rate_at(ts - spec.start_s * 0).reshape(HOURS, 60).mean(axis=1)
    quantum = spec.rate * level_step
    levels: dict[tuple[float, tuple[str, ...]], list[int]] = {}
    for h in range(HOURS):
        rate = max(quantum, round(per_minute[h] / quantum) * quantum)
        down = tuple(sorted({f.region for f in spec.failures if f.replica is None
                             and f.at_s < (h + 1) * 3600 and f.at_s + f.duration_s > h * 3600}))
        levels.setdefault((round(rate, 9), down), []).append(h)
    return [Level(rate, down, hours) for (rate, down), hours in sorted(levels.items())]


def weigh(results: list[tuple[Level, dict]], spec: TrafficSpec, level_s: float, warmup_s: float) -> dict:
    """Combines the levels' results into one week (see the module docstring). GPU-hours and tokens come
    from each level's steady window (after its warm-up), scaled to the hours the level stands for."""
    def window(r: dict) -> dict:
        return r.get("steady") or r

    scale = lambda lv, r: len(lv.hours) * 3600 / window(r).get("duration_s", level_s)  # noqa: E731 - to week s
    gpu: dict[str, float] = {}
    for lv, r in results:
        for g, h in window(r)["gpu_hours"].items():
            gpu[g] = gpu.get(g, 0.0) + h * scale(lv, r)
    tokens_in = sum(window(r)["input_tokens"] * scale(lv, r) for lv, r in results)
    tokens_out = sum(window(r)["output_tokens"] * scale(lv, r) for lv, r in results)
    busy_by = [(window(r)["gpu_busy_share"] * sum(window(r)["gpu_hours"].values()) * scale(lv, r),
                window(r)["token_time_split"]["input"]) for lv, r in results]
    busy = sum(b for b, _ in busy_by)
    split_in = sum(b * s for b, s in busy_by) / busy if busy else 0.0
    hours = sum(len(lv.hours) for lv, _ in results)
    reqs = [(lv, r, r["requests"]["completed"] + r["requests"]["failed"]
             + r["requests"].get("unfinished", 0)) for lv, r in results]
    weight_req = sum(n * len(lv.hours) for lv, _, n in reqs) or 1

    def hour_mean(key: str, p: str) -> float | None:
        vals = [(len(lv.hours), r[key][p]) for lv, r in results if r[key][p] is not None]
        return sum(w * v for w, v in vals) / sum(w for w, _ in vals) if vals else None

    out = {
        "duration_s": float(HOURS * 3600),
        "gpu_hours": {g: round(h, 4) for g, h in gpu.items()},
        "input_tokens": int(tokens_in),
        "output_tokens": int(tokens_out),
        "token_time_split": {"input": round(split_in, 6), "output": round(1 - split_in, 6)},
        "gpu_busy_share": round(busy / sum(gpu.values()), 6) if sum(gpu.values()) else 0.0,
        "levels": [{"rate_rps": lv.rate, "down": list(lv.down), "hours": len(lv.hours), "hours_of_week": lv.hours,
                    "replicas": r["max_replicas"], "ttft_p99_s": r["ttft_s"]["p99"], "tpot_p99_s": r["tpot_s"]["p99"],
                    "attainment": r["slo"]["attainment"], "gpu_hours_per_hour": sum(window(r)["gpu_hours"].values())
                    * 3600 / window(r).get("duration_s", level_s)} for lv, r in results],
        "attainment": sum(r["slo"]["attainment"] * n * len(lv.hours) for lv, r, n in reqs) / weight_req,
        "level_s": level_s, "warmup_s": warmup_s, "hours": hours,
    }
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        out[key] = {p: hour_mean(key, p) for p in ("p50", "p90", "p99")}
    return out


def _run_chain(model: ModelConfig, profile: StepProfile, spec: TrafficSpec, slo: SLO, settings: SimSettings,
               level_s: float, warmup_s: float, fleet, chain: list[tuple[int, Level]], total: int, report) -> None:
    """Simulates `chain`'s levels in order (their rates rise); report(("level", i, result, line)) for each."""
    for i, lv in chain:
        # A constant rate. A failed region goes down when the warm-up ends, so the level measures the
        # failover itself: the other regions' autoscalers catch up with cold starts, as they would.
        fails = [Failure(region=r, at_s=warmup_s, duration_s=level_s * 10) for r in lv.down]
        sub = spec.model_copy(update={"duration_s": level_s, "rate": lv.rate, "diurnal": None, "weekly": None,
                                      "spikes": [], "start_s": 0.0, "failures": fails, "trace": None,
                                      "seed": spec.seed + i})
        sim = FleetSim(model, profile, sub, make_requests(sub), settings, fleet=fleet)
        sim.run()
        res = summarize(sim, slo, warmup_s=warmup_s)
        if settings.replicas is None and sim.timeline:  # rates rise: start the next where this one settled
            last = sim.timeline[-1]["replicas"]
            settings = replace(settings, initial_replicas=tuple((r, max(n, 1)) for r, n in last.items()))
        report(("level", i, res, f"  level {i}/{total}: {lv.rate:.0f} req/s, {len(lv.hours)} h"
                f"{', down: ' + ','.join(lv.down) if lv.down else ''}: peak {res['max_replicas']} replicas, "
                f"p99 TTFT {(res['ttft_s']['p99'] or 0) * 1000:.0f} ms, attainment {res['slo']['attainment']:.3f}"))


def _chain_process(queue, parent: int, *args) -> None:
    start_worker(parent)
    try:
        _run_chain(*args, report=queue.put)
    except BaseException:  # noqa: BLE001 - the parent re-raises it with the worker's traceback
        queue.put(("error", traceback.format_exc()))


def plan_week(model: ModelConfig, profile: StepProfile, spec: TrafficSpec, slo: SLO, *, settings: SimSettings,
              level_s: float = 60.0, warmup_s: float = 20.0, level_step: float = 0.05, workers: int | None = None,
              progress: Callable[[str], None] = print, fleet=None) -> dict:
    """`fleet`: a fleet file with regions: the gateways' region routing decides who serves what (sim/regions.py)."""
    levels = hourly_levels(spec, level_step)
    # Sample the level's own timeline (the caller's resolution suits the whole week), and let the warm-up
    # bring the fleet to this level's steady state: the diurnal curve changes over hours, not seconds.
    settings = replace(settings, sample_s=min(settings.sample_s, level_s / 120), instant_start_until_s=warmup_s)
    workers = worker_count(workers, len(levels))
    progress(f"week: {HOURS} hours -> {len(levels)} distinct load levels of {level_s:g} s each"
             f"{f', {workers} at a time' if workers > 1 else ''}")
    # The levels are independent but for where each starts: the fleet the level below it settled at. So
    # each worker takes every `workers`-th level, in rising order, and starts each from its previous one.
    chains = [[(i, lv) for i, lv in enumerate(levels, 1)][k::workers] for k in range(workers)]
    args = (model, profile, spec, slo, settings, level_s, warmup_s, fleet)
    done: dict[int, dict] = {}
    if workers == 1:
        def report(msg):
            done[msg[1]] = msg[2]
            progress(msg[3])

        _run_chain(*args, chains[0], len(levels), report)
    else:
        ctx = spawn_context()
        queue = ctx.Queue()
        procs = [ctx.Process(target=_chain_process, args=(queue, os.getpid(), *args, chain, len(levels)), daemon=True)
                 for chain in chains]
        for proc in procs:
            proc.start()
        try:
            while len(done) < len(levels):
                msg = queue.get()
                if msg[0] == "error":
                    raise RuntimeError(f"a week worker failed:\n{msg[1]}")
                done[msg[1]] = msg[2]
                progress(msg[3])
        finally:
            for proc in procs:
                if len(done) < len(levels):
                    proc.terminate()  # an error, or Ctrl-C: the other workers stop too
                proc.join(timeout=10)
    return weigh([(lv, done[i]) for i, lv in enumerate(levels, 1)], spec, level_s, warmup_s)
