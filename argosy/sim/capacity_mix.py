"""The cheapest mix of capacity kinds per region for a week (`argosy plan` with a fleet file whose regions
list capacity; docs/regions.md).

The planned fleet (sized at the peak; with `--spare region`, for the loss of any one region: N+1) is spread
over the week's hours by the traffic file's curve (diurnal, weekly): hour h needs ceil(N x rate(h) / peak)
replicas in each region. Then, per region:
- reserved: the k-th reserved replica is taken when it costs less for the whole week (168 h x its price)
  than the hours it would be busy cost on the burst capacity (hours with need >= k x the burst price);
- the burst above the reserved floor: a share on spot, the rest on-demand. The share is the largest of
  1, 0.75, 0.5, 0.25, 0 whose peak still meets the SLO in a simulation where every spot replica is
  preempted once, with notice (it drains, a replacement starts cold: sim/fleet.py);
- each kind within the region's `capacity` count (a burst that does not fit is reported, not hidden).
Prices are the region's `capacity` entries for the planned GPU (a kind it does not list is not offered);
a region without `capacity` takes the price book's tier for each kind.
Money: $/week, $/month (730 h) and $ per million tokens of the week's traffic.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from argosy.config_regions import CAPACITY_KINDS
from argosy.sim.plan_checks import attainment_text
from argosy.sim.traffic import Failure, TrafficSpec

HOURS = 168
HOURS_PER_MONTH = 730
SPOT_SHARES = (1.0, 0.75, 0.5, 0.25, 0.0)


def week_factors(spec: TrafficSpec) -> np.ndarray:
    """Each hour of the week's mean rate over the peak (`rate`); all 1 without a diurnal or weekly curve."""
    if spec.diurnal is None and spec.weekly is None:
        return np.ones(HOURS)
    flat = spec.model_copy(update={"spikes": [], "start_s": 0.0})
    per_minute = flat.rate_at(np.arange(HOURS * 60) * 60.0 + 30.0).reshape(HOURS, 60).mean(axis=1)
    return per_minute / spec.rate


def peak_spec(spec: TrafficSpec, window_s: float = 600.0) -> TrafficSpec:
    """The traffic at its peak for a search: no curve, at most `window_s` long (a week's file describes
    its peak by `rate`)."""
    if spec.diurnal is None and spec.weekly is None:
        return spec
    return spec.model_copy(update={"diurnal": None, "weekly": None, "start_s": 0.0,
                                   "duration_s": min(spec.duration_s, window_s),
                                   "failures": [f for f in spec.failures if f.at_s < window_s]})


def kind_prices(region, gpu: str, tp: int, book: Callable[[str, str | None], float | None]) -> dict:
    """$ per replica-hour and the most replicas of each kind in the region (None: not offered / unbounded).
    A region that lists capacity offers only the kinds it lists, for their GPU; one that lists none is
    priced from the price book, unbounded."""
    out = {}
    for kind in CAPACITY_KINDS:
        c = region.capacity.get(kind)
        if region.capacity:
            offered = c is not None and c.gpu == gpu
            out[kind] = {"usd_per_hour": c.usd_per_hour * tp if offered else None,
                         "max_replicas": c.count // tp if offered else 0, "source": "fleet file"}
            continue
        price = book(kind, region.provider)
        out[kind] = {"usd_per_hour": None if price is None else price * tp, "max_replicas": None,
                     "source": "price book"}
    return out


def region_mix(need: list[int], prices: dict, spot_share: float) -> dict:
    """One region's kinds hour by hour, and what they cost in the week."""
    res, od, spot = (prices[k]["usd_per_hour"] for k in CAPACITY_KINDS)
    cap = {k: prices[k]["max_replicas"] for k in CAPACITY_KINDS}
    share = spot_share if spot is not None and (od is None or spot < od) else 0.0  # spot only where it saves
    if od is None:  # no on-demand to fall back to: the burst is spot (or nothing)
        share = 1.0 if spot is not None else 0.0
    # With no burst kind offered, reserved capacity has to carry every hour, whatever it costs.
    burst_price = float("inf") if od is None and spot is None else share * (spot or 0.0) + (1 - share) * (od or 0.0)
    reserved = 0
    peak = max(need) if need else 0
    while res is not None and reserved < peak and (cap["reserved"] is None or reserved < cap["reserved"]):
        busy = sum(1 for n in need if n > reserved)
        if not HOURS * res < busy * burst_price:
            break
        reserved += 1
    hours = {"on_demand": [], "spot": []}
    unmet = 0
    for n in need:
        burst = max(n - reserved, 0)
        s = math.floor(burst * share + 1e-9)
        if cap["spot"] is not None:
            s = min(s, cap["spot"])
        o = burst - s
        if cap["on_demand"] is not None and o > cap["on_demand"]:
            unmet = max(unmet, o - cap["on_demand"])
        hours["spot"].append(s)
        hours["on_demand"].append(o)
    usd = reserved * HOURS * (res or 0.0) + sum(hours["on_demand"]) * (od or 0.0) + sum(hours["spot"]) * (spot or 0.0)
    return {"reserved": reserved, "on_demand_peak": max(hours["on_demand"], default=0),
            "on_demand_replica_hours": sum(hours["on_demand"]), "spot_peak": max(hours["spot"], default=0),
            "spot_replica_hours": sum(hours["spot"]), "spot_share": share, "unmet_replicas": unmet,
            "usd_per_week": round(usd, 2), "usd_per_month": round(usd * HOURS_PER_MONTH / HOURS, 2),
            "prices": prices}


def week_tokens(spec: TrafficSpec, factors: np.ndarray, share: float) -> tuple[float, float]:
    """(input, output) tokens a region's share of the traffic sends in the week."""
    requests = float(factors.sum()) * 3600 * spec.rate * share
    prefix = spec.shared_prefix.tokens * spec.shared_prefix.fraction if spec.shared_prefix else 0.0
    return requests * (spec.prompt_tokens.mean + prefix), requests * spec.output_tokens.mean


def preemptions(counts: dict[str, int], mix: dict[str, dict], t0: float, t1: float, notice_s: float) -> list:
    """Every spot replica at the peak preempted once, with notice, spread over [t0, t1)."""
    out = []
    for region, n in counts.items():
        spot = mix[region]["spot_peak"]
        for k in range(spot):
            at = t0 + (k + 1) * (t1 - t0) / (spot + 1)
            out.append(Failure(region=region, at_s=at, duration_s=1.0, replica=min(k, n - 1), notice_s=notice_s))
    return out


def plan_mix(trial, chosen: dict, fleet, week: TrafficSpec, book: Callable[[str, str | None], float | None],
             notice_s: float, region_loss: bool | None, progress: Callable[[str], None] = print) -> dict:
    """The cheapest spot share whose peak meets the SLO with its spot replicas preempted; per region its mix."""
    factors = week_factors(week)
    counts = chosen["replicas"]
    regions = {r.name: r for r in fleet.regions}
    shares = {r.name: r.share for r in week.regions}
    total_share = sum(shares.values()) or 1.0
    need = {r: [math.ceil(n * f - 1e-9) for f in factors] for r, n in counts.items()}
    prices = {r: kind_prices(regions[r], chosen["gpu"], chosen["tp"], book) for r in counts if r in regions}
    missing = [r for r in counts if r not in regions]
    if missing:
        raise ValueError(f"traffic regions {missing} are not regions of the fleet file")
    tried = []
    for share in SPOT_SHARES:
        mix = {r: region_mix(need[r], prices[r], share) for r in counts}
        spec = trial.spec.model_copy(update={"failures": [*trial.spec.failures, *preemptions(
            counts, mix, trial.warmup_s(), trial.spec.duration_s, notice_s)]})
        check = dataclasses.replace(trial, spec=spec)
        n_pre = len(spec.failures) - len(trial.spec.failures)
        c = check.candidate(counts) if n_pre else chosen
        tried.append({"spot_share": share, "preempted": n_pre, "attainment": c["attainment"], "met": c["met"]})
        progress(f"capacity mix: spot share {share:g} of the burst, {n_pre} spot preemptions at the peak -> "
                 f"{attainment_text(c)} {'ok' if c['met'] else 'fails'}")
        if c["met"] or share == 0.0:
            break
    out_regions = []
    for r, m in mix.items():
        tin, tout = week_tokens(week, factors, shares.get(r, 0.0) / total_share)
        per_mtok = m["usd_per_week"] / (tin + tout) * 1e6 if tin + tout else None
        out_regions.append({"region": r, "provider": regions[r].provider, "peak_replicas": counts[r],
                            **m, "usd_per_mtok": None if per_mtok is None else round(per_mtok, 4)})
    usd_week = sum(m["usd_per_week"] for m in mix.values())
    tin, tout = week_tokens(week, factors, 1.0)
    return {"regions": out_regions, "usd_per_week": round(usd_week, 2),
            "usd_per_month": round(usd_week * HOURS_PER_MONTH / HOURS, 2),
            "usd_per_mtok": round(usd_week / (tin + tout) * 1e6, 4) if tin + tout else None,
            "week_tokens": {"input": round(tin), "output": round(tout)}, "spot_notice_s": notice_s,
            "checks": tried, "met": tried[-1]["met"], "survives_region_loss": region_loss}


def render_mix(mix: dict) -> str:
    last = mix["checks"][-1]
    lines = [f"capacity mix for a week (a reserved floor, the burst on spot and on-demand): "
             f"${mix['usd_per_week']:,.2f}/week, ${mix['usd_per_month']:,.2f}/month (730 h), "
             f"${mix['usd_per_mtok'] or 0:.4f}/Mtok",
             f"  {'region':12}{'provider':>10}{'peak':>6}{'reserved':>10}{'on-demand':>11}{'spot':>6}"
             f"{'spot share':>12}{'$/week':>12}{'$/month':>12}{'$/Mtok':>9}"]
    for r in mix["regions"]:
        lines.append(f"  {r['region']:12}{r['provider']:>10}{r['peak_replicas']:>6}{r['reserved']:>10}"
                     f"{r['on_demand_peak']:>11}{r['spot_peak']:>6}{r['spot_share']:>12g}"
                     f"{r['usd_per_week']:>12,.2f}{r['usd_per_month']:>12,.2f}{r['usd_per_mtok'] or 0:>9.4f}")
        if r["unmet_replicas"]:
            lines.append(f"    {r['region']}: {r['unmet_replicas']} replicas of the burst exceed its capacity counts")
    lines.append("  (on-demand and spot: the most replicas of the week's busiest hour)")
    lines.append(f"  SLO at the peak with every spot replica preempted once ({mix['spot_notice_s']:g} s notice): "
                 f"{'met' if last['met'] else 'NOT met'} (attainment {last['attainment']:.3f}, "
                 f"{last['preempted']} preemptions); survives the loss of any one region: "
                 f"{ {True: 'yes', False: 'NO', None: 'not checked (--spare region)'}[mix['survives_region_loss']] }")
    return "\n".join(lines)
