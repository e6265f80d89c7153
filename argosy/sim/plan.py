"""`argosy plan`: the cheapest fleet that meets the SLOs for a traffic file, and the cost/latency frontier.

For every GPU type x TP size x max_num_seqs x routing policy, each region's replica count is searched
on its own: counts double in the regions that fail their SLO until every region passes, then each
region bisects down to the fewest that pass (one simulation per step serves every region, since regions
only interact when one fails). Each try is one simulation with fixed counts (no autoscaler: this sizes
the peak). `spare` then grows the cheapest fleets until they survive the loss of a replica in any region
or of a whole region (plan_checks.py), and plan_answer.py prices the answer.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from argosy.config import ModelConfig
from argosy.sim.fleet import FleetSim, SimSettings
from argosy.sim.plan_checks import attainment_text, with_spare
from argosy.sim.profile import ModelShape, RooflineSettings, StepProfile, roofline_profile
from argosy.sim.results import SLO, CertainMisses, attainment_by_region, summarize
from argosy.sim.traffic import Failure, Requests, TrafficSpec
from argosy.sim.workers import spawn_context, start_worker, worker_count


@dataclass(frozen=True)
class PlanSpace:
    gpus: tuple[str, ...] = ("H100",)
    tps: tuple[int, ...] = (1,)
    max_num_seqs: tuple[int, ...] = (256,)
    policies: tuple[str, ...] = ("least_load",)
    max_replicas: int = 64  # per region
    spare: str = "none"  # none | replica | region: what the chosen fleet must survive


@dataclass
class Trial:
    """One configuration (GPU, TP, batch limit, policy) and the simulations run for it."""
    model: ModelConfig
    profile: StepProfile
    spec: TrafficSpec
    reqs: Requests
    slo: SLO
    price: float | None  # $ per GPU-hour
    label: str
    fleet: Any = None  # a FleetConfig with regions: the gateways' region routing decides who serves what

    def warmup_s(self) -> float:
        return min(10.0, self.spec.duration_s / 10)  # fixed fleets are up at t=0: only the caches warm

    def simulate(self, counts: dict[str, int], down: str | None = None) -> tuple[FleetSim, CertainMisses]:
        """One run with fixed counts, stopped as soon as every region has certainly failed its SLO."""
        spec = self.spec
        if down is not None:  # the region fails once the warm-up is over and stays down
            spec = spec.model_copy(update={"failures": [Failure(region=down, at_s=self.warmup_s(),
                                                                duration_s=spec.duration_s * 10)]})
        settings = SimSettings(replicas=max(counts.values()), replicas_by_region=tuple(sorted(counts.items())))
        sim = FleetSim(self.model, self.profile, spec, self.reqs, settings, fleet=self.fleet)
        misses = CertainMisses(sim, self.slo, self.warmup_s())
        sim.run(give_up=misses.failed)
        return sim, misses

    def candidate(self, counts: dict[str, int], down: str | None = None) -> dict:
        sim, misses = self.simulate(counts, down)
        gpus = sum(counts.values()) * self.profile.gpus_per_replica
        out = {"gpu": self.profile.gpu, "tp": self.profile.gpus_per_replica,
               "max_num_seqs": self.model.engine.max_num_seqs, "policy": self.model.routing.policy,
               "replicas": dict(counts), "replicas_per_region": max(counts.values()), "gpus": gpus,
               "usd_per_hour": round(gpus * self.price, 4) if self.price is not None else None,
               "region_load": region_load(sim), "gave_up_s": sim.gave_up_s}
        if sim.gave_up_s is not None:  # failed for certain: what is known is an upper bound on attainment
            lost = int(misses.missed.sum())
            return out | {"ttft_p99_s": None, "tpot_p99_s": None, "met": False, "steady": None,
                          "attainment": round(1 - lost / max(int(misses.totals.sum()), 1), 6),
                          "attainment_by_region": misses.attainment_at_most(), "requests_missed": lost,
                          "timeline": sim.timeline}
        res = summarize(sim, self.slo, warmup_s=self.warmup_s())
        by_region = attainment_by_region(sim, self.slo, self.warmup_s())
        return out | {"ttft_p99_s": res["ttft_s"]["p99"], "tpot_p99_s": res["tpot_s"]["p99"],
                      "attainment": res["slo"]["attainment"], "attainment_by_region": by_region,
                      "met": all(a >= self.slo.attainment for a in by_region.values()),
                      "steady": res["steady"], "timeline": res["timeline"]}


def region_load(sim: FleetSim) -> dict[str, dict]:
    """Per region: requests served, tokens and GPU busy share (whole run: fixed fleets start warm)."""
    out = {}
    end = max(sim.now, sim.spec.duration_s)  # replicas keep serving the last arrivals after the traffic ends
    for idx, region in enumerate(sim.regions):
        reps = [r for r in sim.all_replicas if r.region == idx]
        life = sum(max((r.stopped_s if r.stopped_s is not None else end) - r.started_s, 0.0) for r in reps)
        served = [q for q in sim.done if q.replica.startswith(f"{region.name}-")]
        tokens_in = sum(q.prompt_tokens + len(sim.prefix_tokens.get(q.prefix_group, ())) for q in served)
        out[region.name] = {"requests": len(served), "input_tokens": int(tokens_in),
                            "output_tokens": int(sum(q.output_tokens for q in served)),
                            "busy_share": round(min(sum(r.busy_s for r in reps) / life, 1.0), 4) if life else 0.0,
                            "prefill_share": round(sum(r.prefill_s for r in reps)
                                                   / max(sum(r.busy_s for r in reps), 1e-9), 4)}
    return out


def fewest_passing(trial: Trial, regions: list[str], max_replicas: int, run: Callable[[dict], dict]) -> dict | None:
    """The fewest replicas per region that meet the SLO in every region, or None within max_replicas."""
    counts = dict.fromkeys(regions, 1)
    while True:
        c = run(counts)
        failing = [r for r in regions if c["attainment_by_region"][r] < trial.slo.attainment]
        if not failing:
            break
        if all(counts[r] >= max_replicas for r in failing):
            return None
        counts = {r: min(n * 2, max_replicas) if r in failing else n for r, n in counts.items()}
    lo = {r: n // 2 + 1 if n > 1 else 1 for r, n in counts.items()}  # the fewest passing lie in (n/2, n]
    hi = dict(counts)
    while any(lo[r] < hi[r] for r in regions):
        mid = {r: (lo[r] + hi[r]) // 2 if lo[r] < hi[r] else hi[r] for r in regions}
        c = run(mid)
        for r in regions:
            if lo[r] < hi[r]:
                if c["attainment_by_region"][r] >= trial.slo.attainment:
                    hi[r] = mid[r]
                else:
                    lo[r] = mid[r] + 1
    return run(hi)


def search_trial(trial: Trial, regions: list[str], space: PlanSpace,
                 progress: Callable[[str], None] = print) -> tuple[dict | None, list[dict]]:
    """One configuration's fewest passing replicas per region (grown by `space.spare`), or None, and every
    candidate simulated on the way."""
    tried: list[dict] = []
    cache: dict[tuple, dict] = {}

    def run(counts: dict) -> dict:
        key = tuple(sorted(counts.items()))
        if key not in cache:
            c = cache[key] = trial.candidate(counts)
            tried.append(c)
            where = ", ".join(f"{r} {n}" for r, n in counts.items()) if len(counts) > 1 \
                else f"{next(iter(counts.values()))}"
            ttft = "" if c["ttft_p99_s"] is None else f"p99 TTFT {c['ttft_p99_s'] * 1000:.0f} ms, "
            progress(f"{trial.label}: {where} replicas -> {ttft}{attainment_text(c)} {'ok' if c['met'] else 'fails'}")
        return cache[key]

    found = fewest_passing(trial, regions, space.max_replicas, run)
    if found is not None and space.spare != "none":
        found = with_spare(trial, found, space.spare, space.max_replicas, run, progress)
    if found is not None:
        found["label"] = trial.label
    return found, tried


def search(model: ModelConfig, shape: ModelShape, spec: TrafficSpec, reqs: Requests, slo: SLO, space: PlanSpace,
           roofline: RooflineSettings, prices: Callable[[str], float | None],
           progress: Callable[[str], None] = print, fleet: Any = None, jobs: int | None = 1) -> dict:
    """Every configuration of `space`, each searched on its own; with jobs > 1 (None: one per core), that many
    at once in worker processes (a configuration's bisection is sequential, the configurations are independent). The
    answer does not depend on `jobs`: results are taken in the configurations' order."""
    trials: dict[str, Trial] = {}
    regions = [r.name for r in spec.regions]
    for gpu in space.gpus:
        price = prices(gpu)
        for tp in space.tps:
            try:
                profile = roofline_profile(gpu, shape, tp, roofline)
            except ValueError as e:
                progress(f"skip {gpu} TP {tp}: {e}")
                continue
            for seqs in space.max_num_seqs:
                for policy in space.policies:
                    routing = model.routing.model_copy(update={"policy": policy, "scorers": None})  # the preset
                    m = model.model_copy(update={"engine": model.engine.model_copy(update={"max_num_seqs": seqs}),
                                                 "routing": routing})
                    label = f"{gpu} TP {tp} max_num_seqs {seqs} {policy}"
                    trials[label] = Trial(m, profile, spec, reqs, slo, price, label, fleet)
    jobs = worker_count(jobs, len(trials))
    work = [(t, regions, space, progress) for t in trials.values()]
    if jobs == 1:
        results = [search_trial(*w) for w in work]
    else:
        progress(f"searching {len(trials)} configurations, {jobs} at a time")
        pool = spawn_context().Pool(jobs, initializer=start_worker, initargs=(os.getpid(),))
        try:
            results = pool.starmap(search_trial, work, chunksize=1)
        finally:
            pool.terminate()  # also on Ctrl-C: no worker outlives the plan
            pool.join()
    tried = [c for _, cands in results for c in cands]
    best = [found for found, _ in results if found is not None]
    cost = (lambda c: (c["usd_per_hour"], c["gpus"])) if all(c["usd_per_hour"] is not None for c in tried) \
        else (lambda c: (c["gpus"],))
    best.sort(key=cost)
    frontier, best_ttft = [], float("inf")
    for c in sorted(tried, key=cost):  # cheapest first; keep each that is faster than everything cheaper
        if c["ttft_p99_s"] is not None and c["ttft_p99_s"] < best_ttft:
            frontier.append(c)
            best_ttft = c["ttft_p99_s"]
    return {"cheapest": best[0] if best else None, "passing": best, "frontier": frontier, "candidates": tried,
            "trials": trials, "regions": regions,
            "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "attainment": slo.attainment}}


def brief(c: dict) -> dict:
    """A candidate without its bulky parts (timeline, steady window), for the JSON's long lists."""
    return {k: v for k, v in c.items() if k not in ("timeline", "steady", "region_load", "checks")}
