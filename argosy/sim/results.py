"""The figures of one simulated run: latency percentiles, SLO attainment, goodput, GPU-hours and cost.

The result JSON's top-level keys `duration_s`, `gpu_hours`, `input_tokens`, `output_tokens` and
`token_time_split` cover the whole run; `steady` holds the same keys for the window after the warm-up,
which `argosy cost --sim result.json` prices by default, with `slo` (what it is pricing) and `model`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argosy.sim.fleet import FleetSim
from argosy.sim.profile import StepProfile

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class SLO:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    attainment: float = 0.9  # share of requests that must meet every SLO

    def met(self, ttft: np.ndarray, tpot: np.ndarray, e2e: np.ndarray) -> np.ndarray:
        ok = np.ones(len(ttft), dtype=bool)
        for limit, vals in ((self.ttft_s, ttft), (self.tpot_s, tpot), (self.e2e_s, e2e)):
            if limit is not None:
                ok &= vals <= limit
        return ok


def pct(values: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float | None]:
    if len(values) == 0:
        return {f"p{p}": None for p in PERCENTILES} | {"mean": None}
    if weights is None:
        out = {f"p{p}": float(np.percentile(values, p)) for p in PERCENTILES}
        return out | {"mean": float(values.mean())}
    order = np.argsort(values)
    v, w = values[order], np.cumsum(weights[order])
    out = {f"p{p}": float(v[min(np.searchsorted(w, p / 100 * w[-1]), len(v) - 1)]) for p in PERCENTILES}
    return out | {"mean": float((values * weights).sum() / weights.sum())}


def gpu_prices(gpus: list[str], tier: str, provider: str | None, prices_path: str | None) -> dict[str, float] | None:
    """$ per GPU-hour from the cost package's price book; None when it (or a GPU's price) is missing."""
    try:
        from argosy.cost.prices import load_prices
    except ImportError:
        return None
    try:
        book = load_prices(path=prices_path)
        return {g: float(book.gpu_hour(g, tier=tier, provider=provider)) for g in gpus}
    except (KeyError, ValueError, OSError):
        return None


def request_overheads(profile: StepProfile, rids: list[int]) -> np.ndarray:
    """What serving adds to each request's TTFT and E2E: a draw from the profile's measured spread, fixed per
    request id (the same request gets the same draw in every run), or its single figure."""
    q = profile.request_s_quantiles
    if not q:
        return np.full(len(rids), profile.request_s)
    spread = (np.array(rids, dtype=np.int64) * 2654435761) % 2**32 % len(q)  # Knuth's multiplicative hash
    return np.array(q)[spread]


def latencies(sim: FleetSim, done: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TTFT, TPOT and E2E (s) of finished requests, with what serving adds outside the engine."""
    if not done:
        return np.array([]), np.array([]), np.array([])
    arr = np.array([r.arrival_s for r in done])
    first = np.array([r.first_token_s for r in done])
    fin = np.array([r.finish_s for r in done])
    overhead = request_overheads(sim.profile, [r.rid for r in done]) * np.array([r.overhead_factor for r in done])
    extra = np.array([r.extra_latency_s for r in done]) + overhead
    outs = np.array([r.output_tokens for r in done])
    tpot = np.where(outs > 1, (fin - first) / np.maximum(outs - 1, 1), 0.0)
    return first - arr + extra, tpot, fin - arr + extra


def arrived_after(sim: FleetSim, warmup_s: float) -> np.ndarray:
    """Requests of the traffic arriving at or after warmup_s, by origin region: what attainment divides by, so
    that a request failed, or still unfinished when the simulation stopped, counts as missed."""
    arrival, region = np.asarray(sim.reqs.arrival_s), np.asarray(sim.reqs.region, dtype=np.int64)
    return np.bincount(region[arrival >= warmup_s], minlength=len(sim.regions))


def attainment_by_region(sim: FleetSim, slo: SLO, warmup_s: float) -> dict[str, float]:
    """Share of each origin region's requests (arrived after the warm-up) that met every SLO; failed and
    unfinished ones count as missed."""
    out = {}
    totals = arrived_after(sim, warmup_s)
    for idx, region in enumerate(sim.regions):
        done = [r for r in sim.done if r.arrival_s >= warmup_s and r.region == idx]
        ttft, tpot, e2e = latencies(sim, done)
        total = int(totals[idx])
        out[region.name] = float(slo.met(ttft, tpot, e2e).sum() / total) if total else 1.0
    return out


class CertainMisses:
    """Requests (arrived after the warm-up) that a simulation in progress has already lost for the SLO, by
    origin region: finished over a limit, failed, or still without a first token past the TTFT limit (or
    unfinished past the E2E limit). Nothing later can bring them back, so once every region with traffic
    has lost more than its attainment target allows of all its requests, the fleet has failed: `argosy
    plan` stops simulating it there. An undersized fleet is known to fail long before its queue drains."""

    def __init__(self, sim: FleetSim, slo: SLO, warmup_s: float):
        self.slo, self.warmup_s = slo, warmup_s
        self.names = [r.name for r in sim.regions]
        self.totals = arrived_after(sim, warmup_s)
        self.ended = np.zeros(len(self.names), dtype=np.int64)  # finished or failed, and missed
        self.missed = self.ended.copy()  # and those in flight past a limit, as of the last count
        self.seen_done = self.seen_failed = 0

    def count(self, sim: FleetSim) -> None:
        fresh = [r for r in sim.done[self.seen_done:] if r.arrival_s >= self.warmup_s]
        self.seen_done = len(sim.done)
        if fresh:
            missed = ~self.slo.met(*latencies(sim, fresh))
            np.add.at(self.ended, np.array([r.region for r in fresh])[missed], 1)
        for r in sim.failed[self.seen_failed:]:
            if r.arrival_s >= self.warmup_s:
                self.ended[r.region] += 1
        self.seen_failed = len(sim.failed)
        # A request with no first token by now has a TTFT of at least now - arrival (serving only adds).
        ttft_cut = sim.now - self.slo.ttft_s if self.slo.ttft_s is not None else -np.inf
        e2e_cut = sim.now - self.slo.e2e_s if self.slo.e2e_s is not None else -np.inf
        self.missed = self.ended.copy()
        for region in sim.regions:
            for req in region.in_flight():
                if req.arrival_s >= self.warmup_s and (req.arrival_s < e2e_cut
                                                       or (req.first_token_s is None and req.arrival_s < ttft_cut)):
                    self.missed[req.region] += 1

    def attainment_at_most(self) -> dict[str, float]:
        """By origin region, the best attainment still possible as of the last count (1 without traffic)."""
        return {name: float(1 - self.missed[i] / n) if n else 1.0
                for i, (name, n) in enumerate(zip(self.names, self.totals, strict=True))}

    def failed(self, sim: FleetSim) -> bool:
        """Whether every region with traffic has certainly missed its attainment target (asked as it runs)."""
        self.count(sim)
        best = self.attainment_at_most()
        with_traffic = [best[name] for name, n in zip(self.names, self.totals, strict=True) if n]
        return bool(with_traffic) and all(a < self.slo.attainment for a in with_traffic)


def replica_hours(sim: FleetSim, start_s: float, end_s: float) -> dict[str, float]:
    """GPU-hours by GPU type of every replica's life (started, not yet stopped) within [start_s, end_s]."""
    out: dict[str, float] = {}
    for rep in sim.all_replicas:
        end = min(rep.stopped_s if rep.stopped_s is not None else end_s, end_s)
        hours = max(end - max(rep.started_s, start_s), 0.0) * rep.profile.gpus_per_replica / 3600
        out[rep.profile.gpu] = out.get(rep.profile.gpu, 0.0) + hours
    return out


def _row_at(timeline: list[dict], t: float) -> dict | None:
    """The last timeline row at or before t."""
    rows = [row for row in timeline if row["t"] <= t + 1e-9]
    return rows[-1] if rows else None


def steady_window(sim: FleetSim, warmup_s: float) -> dict:
    """The cost inputs over [warmup_s, duration]: what a fleet costs once it has settled, without the run-up
    from its first replicas (cold starts, an autoscaler catching up, an empty prefix cache)."""
    duration = sim.spec.duration_s
    gpu_hours = replica_hours(sim, warmup_s, duration)
    done = [r for r in sim.done if r.arrival_s >= warmup_s]
    input_tokens = sum(r.prompt_tokens + len(sim.prefix_tokens.get(r.prefix_group, ())) for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    tl = sim.timeline
    first, last = _row_at(tl, warmup_s), _row_at(tl, duration)
    busy = prefill = 0.0
    if first is not None and last is not None and "busy_s" in last:
        busy, prefill = last["busy_s"] - first["busy_s"], last["prefill_s"] - first["prefill_s"]
    split_in = prefill / busy if busy > 0 else 0.0
    gpu_s = sum(gpu_hours.values()) * 3600 / max(sim.profile.gpus_per_replica, 1)  # replica-seconds
    return {"from_s": float(warmup_s), "duration_s": float(duration - warmup_s),
            "gpu_hours": {g: round(h, 6) for g, h in gpu_hours.items()},
            "input_tokens": int(input_tokens), "output_tokens": int(output_tokens), "requests": len(done),
            "token_time_split": {"input": round(split_in, 6), "output": round(1 - split_in, 6)},
            "gpu_busy_share": round(min(busy / gpu_s, 1.0), 6) if gpu_s > 0 else 0.0}


def auto_warmup_s(duration_s: float, cold_start_s: float, autoscaled: bool) -> float:
    """The warm-up `argosy sim` leaves out by default: a tenth of the run, and with an autoscaler at least two
    cold starts (the first scale-up and the one it triggers), at most half the run."""
    return min(duration_s / 2, max(duration_s / 10, 2 * cold_start_s if autoscaled else 0.0))


def summarize(sim: FleetSim, slo: SLO, warmup_s: float = 0.0, prices: dict[str, float] | None = None) -> dict:
    """The result dict. Requests arriving in the first `warmup_s` count for the whole run's tokens and GPU
    time but not for latency nor for the `steady` window (a week level is measured in steady state)."""
    duration = sim.spec.duration_s
    done = [r for r in sim.done if r.arrival_s >= warmup_s]
    failed = [r for r in sim.failed if r.arrival_s >= warmup_s]
    outs = np.array([r.output_tokens for r in done])
    ttft, tpot, e2e = latencies(sim, done)
    itl = [x for rep in sim.all_replicas for x in rep.itl]
    itl_v = np.array([g for g, _ in itl])
    itl_w = np.array([w for _, w in itl], dtype=float)
    met = slo.met(ttft, tpot, e2e)
    total = int(arrived_after(sim, warmup_s).sum())  # failed and unfinished requests count as missed
    attainment = float(met.sum() / total) if total else 1.0
    window = max(duration - warmup_s, 1e-9)
    gpu_hours = replica_hours(sim, 0.0, duration)
    busy = sum(rep.busy_s for rep in sim.all_replicas)
    prefill = sum(rep.prefill_s for rep in sim.all_replicas)
    all_done = sim.done
    input_tokens = sum(r.prompt_tokens + len(sim.prefix_tokens.get(r.prefix_group, ())) for r in all_done)
    output_tokens = sum(r.output_tokens for r in all_done)
    cached = sum(r.cached_tokens for r in all_done)
    split_in = prefill / busy if busy else 0.0
    cost = None
    if prices is not None:
        cost = {"usd": round(sum(h * prices[g] for g, h in gpu_hours.items()), 4),
                "usd_per_gpu_hour": prices}
    tl = sim.timeline
    node = getattr(sim, "node", None)
    return {
        "duration_s": float(duration),
        "gpu_hours": {g: round(h, 6) for g, h in gpu_hours.items()},
        "input_tokens": int(input_tokens),
        "output_tokens": int(output_tokens),
        "token_time_split": {"input": round(split_in, 6), "output": round(1 - split_in, 6)},
        "requests": {"completed": len(done), "failed": len(failed), "unfinished": total - len(done) - len(failed),
                     "measured_from_s": warmup_s},
        "ttft_s": pct(ttft), "tpot_s": pct(tpot), "itl_s": pct(itl_v, itl_w), "e2e_s": pct(e2e),
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s, "attainment_target": slo.attainment,
                "attainment": round(attainment, 6), "met": attainment >= slo.attainment},
        "throughput": {"requests_per_s": len(done) / window, "goodput_requests_per_s": float(met.sum()) / window,
                       "output_tokens_per_s": float(outs.sum()) / window if len(done) else 0.0},
        "prefix_cache_hit_rate": round(cached / input_tokens, 6) if input_tokens else 0.0,
        "preemptions": int(sum(r.preemptions for r in all_done)),
        "gpu_busy_share": round(busy / max(sum(gpu_hours.values()) * 3600, 1e-9)
                                * sim.profile.gpus_per_replica, 6),
        "queue_depth": pct(np.array([row["queue"] for row in tl], dtype=float)),
        "max_replicas": max((sum(row["replicas"].values()) for row in tl), default=0),
        "cost": cost,
        "steady": steady_window(sim, warmup_s),
        "model": {"name": sim.model.name, "params": sim.profile.notes.get("params")},
        "profile": sim.profile.name,
        "timeline": tl,
        "scaling_decisions": sim.decisions[-200:],
        "served_by": served_by(sim, warmup_s),
        "spot_preemptions": sim.preemptions,
        # --node-cores: the CPU seconds the simulated node spent, before sharing stretched them.
        "node_cpu_s": None if node is None else {
            "engines": round(sum(r.engine_cpu_s for r in sim.all_replicas), 6),
            "outside": round(sum(r.outside_cpu_s for r in sim.all_replicas), 6),
            "starts": round(node.start_cpu_s, 6), "cores": node.cores},
    }


def served_by(sim: FleetSim, warmup_s: float) -> dict[str, dict[str, int]]:
    """Requests (arrived after the warm-up) by the region they arrived at, then the region that served them."""
    out: dict[str, dict[str, int]] = {}
    for r in sim.done:
        rep = sim.by_name.get(r.replica)
        if r.arrival_s < warmup_s or rep is None:
            continue
        row = out.setdefault(sim.regions[r.region].name, {})
        where = sim.regions[rep.region].name
        row[where] = row.get(where, 0) + 1
    return out


def render_text(res: dict) -> str:
    def ms(d: dict) -> str:
        return "  ".join(f"{k} {v * 1000:.1f} ms" if v is not None else f"{k} -" for k, v in d.items())

    slo = res["slo"]
    warm = res["requests"]["measured_from_s"]
    lines = [
        f"profile: {res['profile']}",
        f"requests: {res['requests']['completed']} completed, {res['requests']['failed']} failed"
        + (f", {res['requests']['unfinished']} unfinished when the run stopped"
           if res["requests"].get("unfinished") else "")
        + f" over {res['duration_s']:g} s"
        + (f" (latencies from {warm:g} s on: the warm-up is left out)" if warm else ""),
        f"TTFT  {ms(res['ttft_s'])}", f"TPOT  {ms(res['tpot_s'])}", f"ITL   {ms(res['itl_s'])}",
        f"E2E   {ms(res['e2e_s'])}",
        f"throughput: {res['throughput']['requests_per_s']:.2f} req/s, "
        f"{res['throughput']['output_tokens_per_s']:.1f} output tokens/s; goodput "
        f"{res['throughput']['goodput_requests_per_s']:.2f} req/s",
        f"SLO attainment: {slo['attainment'] * 100:.1f}% (target {slo['attainment_target'] * 100:.0f}%): "
        f"{'met' if slo['met'] else 'NOT met'}",
        f"prefix-cache hit rate: {res['prefix_cache_hit_rate'] * 100:.1f}% of input tokens; "
        f"preemptions: {res['preemptions']}; peak replicas: {res['max_replicas']}",
        "GPU-hours: " + ", ".join(f"{g} {h:.3f} h" for g, h in res["gpu_hours"].items()),
    ]
    st = res.get("steady")
    if st and warm:
        lines.append(f"steady state ({st['from_s']:g}-{res['duration_s']:g} s, what `argosy cost --sim` prices): "
                     + ", ".join(f"{g} {h:.3f} h" for g, h in st["gpu_hours"].items())
                     + f", GPUs busy {st['gpu_busy_share'] * 100:.0f}%")
    cpu = res.get("node_cpu_s")
    if cpu:
        total = cpu["engines"] + cpu["outside"] + cpu["starts"]
        lines.append(f"node CPU ({cpu['cores']:g} cores): {total:.1f} CPU-s: engines {cpu['engines']:.1f} s, "
                     f"outside them (gateway, event loops, client) {cpu['outside']:.1f} s, "
                     f"replica starts {cpu['starts']:.1f} s")
    away = {a: row for a, row in (res.get("served_by") or {}).items() if set(row) - {a}}
    for arrival, row in away.items():  # who served what, where some went to another region
        lines.append(f"arrived in {arrival}: served " + ", ".join(f"{n} in {w}" for w, n in row.items()))
    if res.get("spot_preemptions"):
        lines.append(f"spot preemptions: {res['spot_preemptions']} (drained and replaced)")
    if res["cost"] is not None:
        lines.append(f"cost: ${res['cost']['usd']:.2f}")
    return "\n".join(lines)
