"""`argosy plan`: the cheapest fleet that meets the SLOs for a traffic file, and the cost/latency frontier.

For every GPU type x TP size x max_num_seqs x routing policy, the replicas per region are searched:
doubling while the SLOs fail (more replicas only while they fail), then bisecting down to the fewest
that pass. Each try is one simulation with a fixed replica count (no autoscaler: this sizes the peak).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from argosy.config import ModelConfig
from argosy.sim.fleet import FleetSim, SimSettings
from argosy.sim.profile import ModelShape, RooflineSettings, StepProfile, roofline_profile
from argosy.sim.results import SLO, summarize
from argosy.sim.traffic import Requests, TrafficSpec


@dataclass(frozen=True)
class PlanSpace:
    gpus: tuple[str, ...] = ("H100",)
    tps: tuple[int, ...] = (1,)
    max_num_seqs: tuple[int, ...] = (256,)
    policies: tuple[str, ...] = ("least_load",)
    max_replicas: int = 64  # per region


def _try(model: ModelConfig, profile: StepProfile, spec: TrafficSpec, reqs: Requests, slo: SLO, replicas: int,
         price: float | None) -> dict:
    sim = FleetSim(model, profile, spec, reqs, SimSettings(replicas=replicas))
    sim.run()
    res = summarize(sim, slo, warmup_s=min(10.0, spec.duration_s / 10))
    gpus = replicas * len(spec.regions) * profile.gpus_per_replica
    return {"gpu": profile.gpu, "tp": profile.gpus_per_replica, "max_num_seqs": model.engine.max_num_seqs,
            "policy": model.routing.policy, "replicas_per_region": replicas, "gpus": gpus,
            "usd_per_hour": round(gpus * price, 4) if price is not None else None,
            "ttft_p99_s": res["ttft_s"]["p99"], "tpot_p99_s": res["tpot_s"]["p99"],
            "attainment": res["slo"]["attainment"], "met": res["slo"]["met"]}


def search(model: ModelConfig, shape: ModelShape, spec: TrafficSpec, reqs: Requests, slo: SLO, space: PlanSpace,
           roofline: RooflineSettings, prices: Callable[[str], float | None],
           progress: Callable[[str], None] = print) -> dict:
    tried: list[dict] = []
    best: list[dict] = []
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
                    cache: dict[int, dict] = {}
                    label = f"{gpu} TP {tp} max_num_seqs {seqs} {policy}"

                    def run(n: int, m=m, profile=profile, cache=cache, price=price, label=label) -> dict:
                        if n not in cache:
                            cache[n] = _try(m, profile, spec, reqs, slo, n, price)
                            tried.append(cache[n])
                            c = cache[n]
                            ttft_ms = (c["ttft_p99_s"] or 0) * 1000
                            progress(f"{label}: {n} replicas/region -> p99 TTFT {ttft_ms:.0f} ms, "
                                     f"attainment {c['attainment']:.3f} {'ok' if c['met'] else 'fails'}")
                        return cache[n]

                    n = 1
                    while not run(n)["met"] and n < space.max_replicas:
                        n = min(n * 2, space.max_replicas)
                    if not run(n)["met"]:
                        continue
                    lo, hi = n // 2 + 1 if n > 1 else 1, n  # the fewest passing in (n/2, n]
                    while lo < hi:
                        mid = (lo + hi) // 2
                        lo, hi = (lo, mid) if run(mid)["met"] else (mid + 1, hi)
                    best.append(run(hi))
    cost = (lambda c: (c["usd_per_hour"], c["gpus"])) if all(c["usd_per_hour"] is not None for c in tried) \
        else (lambda c: (c["gpus"],))
    best.sort(key=cost)
    frontier, best_ttft = [], float("inf")
    for c in sorted(tried, key=cost):  # cheapest first; keep each that is faster than everything cheaper
        if c["ttft_p99_s"] is not None and c["ttft_p99_s"] < best_ttft:
            frontier.append(c)
            best_ttft = c["ttft_p99_s"]
    return {"cheapest": best[0] if best else None, "passing": best, "frontier": frontier, "candidates": tried,
            "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "attainment": slo.attainment}}


def render_plan(res: dict) -> str:
    def row(c: dict) -> str:
        usd = f"${c['usd_per_hour']:.2f}/h" if c["usd_per_hour"] is not None else "-"
        return (f"  {c['gpu']:>5} TP{c['tp']} seqs {c['max_num_seqs']:>4} {c['policy']:<11} "
                f"{c['replicas_per_region']:>3}/region {c['gpus']:>4} GPUs {usd:>12}  p99 TTFT "
                f"{(c['ttft_p99_s'] or 0) * 1000:7.0f} ms  p99 TPOT {(c['tpot_p99_s'] or 0) * 1000:6.1f} ms  "
                f"attainment {c['attainment']:.3f}{'' if c['met'] else '  (fails)'}")

    lines = ["cost vs latency frontier (cheapest first):", *map(row, res["frontier"])]
    if res["cheapest"] is None:
        lines.append("no fleet in the search space meets the SLOs: widen it (--gpus, --tp, --max-replicas)")
    else:
        lines += ["cheapest fleet meeting the SLOs:", row(res["cheapest"])]
    return "\n".join(lines)
