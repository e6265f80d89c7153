"""The text report of an estimate: a few tables, every figure with its unit."""

from __future__ import annotations


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.2f}"


def _mtok(x: float | None) -> str:
    return "-" if x is None else f"${x:,.3f}/Mtok"


def _tok(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:,.1f} {unit}tok"
    return f"{x:,.0f} tok"


def render(est: dict) -> str:
    t = est["traffic"]
    period = f"{est['period']} ({est['period_hours']:g} h)"
    out = [*_slo_lines(est), f"Cost estimate for one {period}, from {est['source']}"
           + (f": {est['window']}" if est.get("window") else ""),
           f"Traffic: {_tok(t['input_tokens'])} input + {_tok(t['output_tokens'])} output"
           f" ({_tok(t['input_tokens_per_day'])}/day + {_tok(t['output_tokens_per_day'])}/day)"
           + (f", {t['requests']:,} requests" if t["requests"] is not None else ""),
           "",
           f"{'GPU':6}{'tier':11}{'provider':11}{'$/GPU-h':>9}{'GPU-h':>12}{'cost':>16}"]
    for g in est["gpus"]:
        out.append(f"{g['gpu']:6}{g['tier']:11}{g['provider']:11}{g['usd_per_gpu_hour']:>9.2f}"
                   f"{g['gpu_hours']:>12,.1f}{_usd(g['usd']):>16}")
    out += [f"Average GPUs: {est['average_gpus']:g} on {est['nodes']} node(s); utilization (busy share): "
            f"{100 * est['utilization']:.0f} % ({est['utilization_from']}); idle GPU cost {_usd(est['idle_gpu_usd'])}",
            "",
            f"GPU cost per token (input share of GPU time {100 * est['input_share']:.1f} %,"
            f" {est['input_share_from']}):",
            f"  input:  {_mtok(est['usd_per_mtok_input'])}   ({_usd(est['gpu_input_usd'])})",
            f"  output: {_mtok(est['usd_per_mtok_output'])}   ({_usd(est['gpu_output_usd'])})",
            "",
            f"Total cost of ownership, one {period}:"]
    oh = est["overheads"]
    notes = {"gpus": f"{est['gpu_hours']:,.1f} GPU-h",
             "engineering": f"{oh['engineering_fte']:g} FTE at ${oh['loaded_annual_salary_usd']:,.0f}/year",
             "monitoring": f"{est['nodes']} node(s) x ${oh['monitoring_usd_per_node_month']:,.0f}/month"
                           f" + ${oh['monitoring_fixed_usd_month']:,.0f}/month",
             "operations": f"${oh['operations_usd_month']:,.0f}/month"}
    for name, usd in est["lines"].items():
        out.append(f"  {name:12}{_usd(usd):>16}   {notes[name]}")
    out += [f"  {'total':12}{_usd(est['total_usd']):>16}   all-in {_mtok(est['all_in_usd_per_mtok'])}", ""]
    if est["api_comparisons"]:
        out.append(_render_apis(est))
    elif est.get("api_scope"):
        out += [f"Hosted APIs: {est['api_scope']}", ""]
    out.append(f"Prices: {est['prices_note']}")
    return "\n".join(out)


def _slo_lines(est: dict) -> list[str]:
    """What is priced, said first: a fleet that missed its SLO does not cost what serving the traffic costs."""
    slo = est.get("slo")
    if not slo or slo.get("attainment") is None:
        return []
    target = slo.get("attainment_target")
    line = (f"Pricing a fleet whose SLO attainment was {slo['attainment'] * 100:.1f}%"
            + (f" (target {target * 100:.0f}%)" if target is not None else ""))
    if slo.get("met") is False:
        bar = "!" * 100
        return [bar, f"WARNING: {line}: the SLO was NOT met. This is the cost of a fleet that fails its users, "
                     "not of serving this traffic; `argosy plan` finds one that passes.", bar, ""]
    return [line + ": met.", ""]


def _render_apis(est: dict) -> str:
    by_req = est["traffic"]["requests"] is not None
    out = [f"Hosted API at the same volume (self-hosted: {_usd(est['total_usd'])}; break-even in replicas of "
           f"{est['replica_gpus']} GPU(s)):",
           f"  compared with {est['api_scope']}",
           f"  {'API':40} {'$/Mtok in/out':>13} {'API cost':>15}  {'break-even':30}  always cheaper from"]
    notes = []
    for c in est["api_comparisons"]:
        be = c["break_even"]
        prices = f"{c['input_usd_per_mtok']:.2f}/{c['output_usd_per_mtok']:.2f}"
        if be["tokens_per_day"] is None:
            first = last = "never"
            notes.append(f"  {c['api']}: {be['reason']}")
        else:
            first = f"{_tok(be['tokens_per_day'])}/day"
            last = f"{_tok(be['always_cheaper_from_tokens_per_day'])}/day"
            if by_req:
                first += f" ({be['requests_per_s']:.3g} req/s)"
                last += f" ({be['always_cheaper_from_requests_per_s']:.3g} req/s)"
        out.append(f"  {c['api']:40} {prices:>13} {_usd(c['api_usd']):>15}  {first:30}  {last}")
    return "\n".join(out + notes + [""])
