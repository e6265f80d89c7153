"""The operator's answer from a plan search: per region, what to run and what it costs, how sure it is,
what it survives, the break-even against hosted APIs of a comparable model, and each GPU type's best.

Money is the GPU cost of the fleet at the price book's rate for the capacity kind asked (`--price-tier`);
the all-in figures and the break-even add the book's overheads, as `argosy cost` does (its estimator is
called on the same usage, so `argosy cost --plan plan.json` prints the same numbers).
"""

from __future__ import annotations

from collections.abc import Callable

from argosy.cost.formulas import HOURS_PER_MONTH


def _per_mtok(usd: float, tokens: float) -> float | None:
    return round(usd / tokens * 1e6, 4) if tokens > 0 else None


def region_rows(cand: dict, price: float | None, tier: str, room: dict | None = None) -> list[dict]:
    hours = cand["steady"]["duration_s"] / 3600 if cand.get("steady") else None
    run_h = (cand["timeline"][-1]["t"] if cand.get("timeline") else 0) / 3600 or hours or 1.0
    rows = []
    for region, n in cand["replicas"].items():
        load = cand["region_load"][region]
        gpus = n * cand["tp"]
        usd_h = gpus * price if price is not None else None
        row = {"region": region, "gpu": cand["gpu"], "tp": cand["tp"], "replicas": n, "gpus": gpus,
               "capacity_kind": tier, "usd_per_hour": None if usd_h is None else round(usd_h, 4),
               "usd_per_month": None if usd_h is None else round(usd_h * HOURS_PER_MONTH, 2),
               "attainment": cand["attainment_by_region"][region], "busy_share": load["busy_share"],
               "headroom": (room or {}).get(region),
               "usd_per_mtok_input": None, "usd_per_mtok_output": None}
        if usd_h is not None:
            spent = usd_h * run_h
            row["usd_per_mtok_input"] = _per_mtok(spent * load["prefill_share"], load["input_tokens"])
            row["usd_per_mtok_output"] = _per_mtok(spent * (1 - load["prefill_share"]), load["output_tokens"])
        rows.append(row)
    return rows


def usage_of(cand: dict, slo: dict, model_params: float | None) -> dict:
    """The chosen fleet's steady-state usage, in the shape `argosy cost --plan` reads."""
    st = cand["steady"]
    return {"duration_s": st["duration_s"], "gpu_hours": st["gpu_hours"], "input_tokens": st["input_tokens"],
            "output_tokens": st["output_tokens"], "token_time_split": st["token_time_split"],
            "gpu_busy_share": st["gpu_busy_share"], "requests": st["requests"],
            "slo": {**slo, "attainment_target": slo.get("attainment"), "attainment": cand["attainment"],
                    "met": cand["met"]},
            "model": {"params": model_params}, "replicas_per_gpu": cand["tp"]}


def answer(res: dict, model_params: float | None, tier: str, provider: str | None, prices_path: str | None,
           run_checks: Callable[[dict], dict] | None = None, run_headroom: Callable[[dict], dict] | None = None
           ) -> dict | None:
    chosen = res["cheapest"]
    if chosen is None:
        return None
    from argosy.cost.estimate import CostOptions, estimate
    from argosy.cost.prices import PriceError, load_prices
    from argosy.cost.usage import plan_usage

    checks = chosen.get("checks") or (run_checks(chosen) if run_checks else None)
    price = chosen["usd_per_hour"] / chosen["gpus"] if chosen["usd_per_hour"] is not None else None
    out = {"chosen": {k: chosen[k] for k in ("label", "gpu", "tp", "max_num_seqs", "policy", "replicas", "gpus",
                                            "usd_per_hour", "attainment", "ttft_p99_s", "tpot_p99_s")},
           "regions": region_rows(chosen, price, tier, run_headroom(chosen) if run_headroom else None),
           "checks": checks, "capacity_kind": tier,
           "usd_per_month": None if price is None else round(chosen["usd_per_hour"] * HOURS_PER_MONTH, 2),
           "usage": usage_of(chosen, res["slo"], model_params)}
    by_gpu: dict[str, dict] = {}
    for c in res["passing"]:  # sorted cheapest first: the first of each GPU type is its best
        by_gpu.setdefault(c["gpu"], c)
    out["by_gpu"] = [{k: c[k] for k in ("label", "gpu", "tp", "max_num_seqs", "policy", "replicas", "gpus",
                                        "usd_per_hour", "attainment", "ttft_p99_s")}
                     | {"usd_per_month": None if c["usd_per_hour"] is None
                        else round(c["usd_per_hour"] * HOURS_PER_MONTH, 2)} for c in by_gpu.values()]
    out["runner_up"] = out["by_gpu"][1] if len(out["by_gpu"]) > 1 else None
    try:
        est = estimate(plan_usage(out["usage"], "argosy plan"), load_prices(prices_path),
                       CostOptions(tier_mix={tier: 1.0}, provider=provider, replica_gpus=chosen["tp"]))
        out["cost"] = {k: est[k] for k in ("total_usd", "gpu_usd", "all_in_usd_per_mtok", "usd_per_mtok_input",
                                           "usd_per_mtok_output", "api_scope", "api_comparisons", "period")}
    except (PriceError, ValueError) as e:
        out["cost"] = {"error": str(e)}
    return out


def _money(x: float | None, fmt: str = ",.2f") -> str:
    return "-" if x is None else f"${x:{fmt}}"


def _yes(v: bool | None) -> str:
    return "n/a" if v is None else "yes" if v else "NO"


def _room(h: dict | None) -> str:
    """+40%: the region meets its SLO up to 1.4x the planned peak (">=" when even the last step passed)."""
    if not h or h.get("max_rate_multiplier") is None:
        return "-"
    return f"{'>=' if h['at_least'] else ''}+{(h['max_rate_multiplier'] - 1) * 100:.0f}%"


def render_answer(a: dict | None) -> str:
    if a is None:
        return "no fleet in the search space meets the SLOs: widen it (--gpus, --tp, --max-replicas)"
    c, chk = a["chosen"], a["checks"] or {}
    lines = [f"The answer: {c['label']}, {c['gpus']} GPUs ({a['capacity_kind']}), "
             f"{_money(c['usd_per_hour'])}/h, {_money(a['usd_per_month'])}/month (730 h)",
             f"  {'region':12}{'GPUs':>14}{'$/h':>11}{'$/month':>13}{'$/Mtok in':>11}{'$/Mtok out':>12}"
             f"{'SLO met':>9}{'headroom':>10}"]
    for r in a["regions"]:
        gpus = f"{r['replicas']}x{r['tp']} {r['gpu']}"
        lines.append(f"  {r['region']:12}{gpus:>14}{_money(r['usd_per_hour']):>11}{_money(r['usd_per_month']):>13}"
                     f"{_money(r['usd_per_mtok_input'], '.3f'):>11}{_money(r['usd_per_mtok_output'], '.3f'):>12}"
                     f"{r['attainment'] * 100:>8.1f}%{_room(r['headroom']):>10}")
    lines.append("  headroom: how much the peak rate can grow before the region misses its SLO (steps of "
                 "+10, 25, 50, 100, 200%)")
    lines.append(f"  survives the loss of a replica: {_yes(chk.get('replica_loss'))}; "
                 f"of a region: {_yes(chk.get('region_loss'))}"
                 + ("" if chk.get("replica_loss") else "  (the fewest that pass: add --spare replica or region)"))
    cost = a.get("cost") or {}
    if "error" in cost:
        lines.append(f"  cost of ownership: not priced ({cost['error']})")
    elif cost:
        lines.append(f"  all in (GPUs + the price book's overheads): {_money(cost['total_usd'])}/month, "
                     f"{_money(cost['all_in_usd_per_mtok'], '.3f')}/Mtok")
        lines.append(f"  break-even against {cost['api_scope']}:")
        for cmp in cost["api_comparisons"]:
            be = cmp["break_even"]
            when = "never (the API is cheaper at every volume)" if be["tokens_per_day"] is None else \
                f"from {be['tokens_per_day'] / 1e6:,.0f} Mtok/day"
            lines.append(f"    {cmp['api']:40} API {_money(cmp['api_usd'])}/month; self-hosting cheaper {when}")
    if len(a["by_gpu"]) > 1:
        lines.append("best fleet per GPU type (runner-ups):")
        for b in a["by_gpu"]:
            lines.append(f"  {b['label']:44} {b['gpus']:>4} GPUs {_money(b['usd_per_hour']):>11}/h "
                         f"{_money(b['usd_per_month']):>13}/month  attainment {b['attainment']:.3f}")
    return "\n".join(lines)


def render_plan(res: dict) -> str:
    def row(c: dict) -> str:
        usd = f"${c['usd_per_hour']:.2f}/h" if c["usd_per_hour"] is not None else "-"
        where = ", ".join(f"{r} {n}" for r, n in c["replicas"].items())
        return (f"  {c['gpu']:>5} TP{c['tp']} seqs {c['max_num_seqs']:>4} {c['policy']:<11} "
                f"{where:>12} replicas {c['gpus']:>4} GPUs {usd:>12}  p99 TTFT "
                f"{(c['ttft_p99_s'] or 0) * 1000:7.0f} ms  p99 TPOT {(c['tpot_p99_s'] or 0) * 1000:6.1f} ms  "
                f"attainment {c['attainment']:.3f}{'' if c['met'] else '  (fails)'}")

    return "\n".join(["cost vs latency frontier (cheapest first):", *map(row, res["frontier"]), "",
                      render_answer(res.get("answer"))])
