"""The estimate: a `Usage` and a price book in, the period's cost lines and API comparisons out."""

from __future__ import annotations

from dataclasses import dataclass, field

from argosy.cost import formulas as f
from argosy.cost.prices import PriceBook
from argosy.cost.usage import Usage


@dataclass(frozen=True)
class CostOptions:
    period: str = "month"  # week (168 h) or month (730 h)
    tier_mix: dict[str, float] = field(default_factory=lambda: {"on_demand": 1.0})
    provider: str | None = None  # None: the cheapest in the book for each GPU and tier
    input_share: float | None = None  # overrides the simulation's split and the default
    utilization: float | None = None  # overrides the simulation's; default 1 (the traffic was the capacity)
    replica_gpus: int = 1  # GPUs of one replica: self-hosting grows in these steps
    api: str | None = None  # compare with this offering only (provider/model)
    all_apis: bool = False  # compare with every API in the book, not only those of a comparable model size
    # Overhead overrides; None: the price book's default.
    engineering_fte: float | None = None
    loaded_annual_salary_usd: float | None = None
    monitoring_usd_per_node_month: float | None = None
    monitoring_fixed_usd_month: float | None = None
    operations_usd_month: float | None = None


def _pick(override: float | None, default: float) -> float:
    return default if override is None else override


def _r(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)


SIZE_RATIO = 2.0  # "comparable size": the API's model within 2x of the priced model's parameters, either way


def comparable_apis(book: PriceBook, opts: CostOptions, model_params: float | None) -> tuple[list, str]:
    """The API offerings to compare with, and a line saying which and why."""
    if opts.api:
        return [book.api(opts.api)], "the API asked for (--api)"
    apis = list(book.api_prices)
    if opts.all_apis:
        return apis, "every API in the price book (--all-apis), whatever its model's size"
    if model_params is None:
        return apis, "every API in the price book: the priced model's size is unknown"
    size_b = model_params / 1e9
    near = [a for a in apis if a.params_b is None or 1 / SIZE_RATIO <= a.params_b / size_b <= SIZE_RATIO]
    if near:
        return near, (f"APIs serving models of {size_b / SIZE_RATIO:.3g}-{size_b * SIZE_RATIO:.3g}B parameters "
                      f"(the priced model has {size_b:.3g}B; --all-apis for every one)")
    sized = [a for a in apis if a.params_b is not None]
    closest = min(sized, key=lambda a: max(a.params_b / size_b, size_b / a.params_b)) if sized else None
    shown = [a for a in sized if closest is not None and a.params_b == closest.params_b]
    return shown, (f"no API in the price book serves a model within {SIZE_RATIO:g}x of {size_b:.3g}B parameters; "
                   + (f"the closest size ({closest.params_b:g}B) is shown: the comparison is not like for like"
                      if closest else "none shown"))


def _gpu_lines(usage: Usage, book: PriceBook, opts: CostOptions, scale: float) -> list[dict]:
    lines = []
    for gpu, hours in sorted(usage.gpu_hours.items()):
        for tier, share in opts.tier_mix.items():
            if share <= 0:
                continue
            price = book.gpu_price(gpu, tier, opts.provider)
            gpu_hours = hours * scale * share
            lines.append({"gpu": price.gpu, "tier": tier, "provider": price.provider,
                          "usd_per_gpu_hour": price.usd_per_gpu_hour, "gpu_hours": gpu_hours,
                          "usd": gpu_hours * price.usd_per_gpu_hour, "source": price.source, "as_of": price.as_of})
    return lines


def estimate(usage: Usage, book: PriceBook, opts: CostOptions) -> dict:
    """Every figure of the report, as a JSON-ready dict (money rounded to cents)."""
    if opts.period not in f.PERIOD_HOURS:
        raise ValueError(f"period must be one of {', '.join(f.PERIOD_HOURS)}, got {opts.period!r}")
    hours = f.PERIOD_HOURS[opts.period]
    scale = hours / usage.duration_h
    input_tokens, output_tokens = usage.input_tokens * scale, usage.output_tokens * scale
    tokens = input_tokens + output_tokens

    gpu_lines = _gpu_lines(usage, book, opts, scale)
    gpu_usd = sum(line["usd"] for line in gpu_lines)
    gpu_hours = sum(line["gpu_hours"] for line in gpu_lines)

    if opts.input_share is not None:
        share, share_from = opts.input_share, "flag"
    elif usage.input_share is not None:
        share, share_from = usage.input_share, "simulation"
    else:
        share = f.default_input_share(input_tokens, output_tokens)
        share_from = f"default: an output token weighs {f.OUTPUT_TOKEN_WEIGHT:g} input tokens"
    input_usd, output_usd = f.split_cost(gpu_usd, share)
    util = _pick(opts.utilization, usage.utilization if usage.utilization is not None else 1.0)
    util_from = "flag" if opts.utilization is not None else (
        "simulation" if usage.utilization is not None else "default: the traffic kept the GPUs busy")

    oh = book.overheads
    per_node = _pick(opts.monitoring_usd_per_node_month, oh.monitoring.usd_per_node_month)
    fixed_monitoring = _pick(opts.monitoring_fixed_usd_month, oh.monitoring.fixed_usd_month)
    nodes = f.nodes_for(gpu_hours / hours, oh.monitoring.gpus_per_node)
    fte = _pick(opts.engineering_fte, oh.engineering.fte)
    salary = _pick(opts.loaded_annual_salary_usd, oh.engineering.loaded_annual_salary_usd)
    ops_month = _pick(opts.operations_usd_month, oh.operations.usd_month)
    engineering = f.engineering_usd(fte, salary, hours)
    monitoring = f.monitoring_usd(nodes, per_node, fixed_monitoring, hours)
    operations = f.operations_usd(ops_month, hours)
    total = gpu_usd + engineering + monitoring + operations

    # Break-even inputs: fixed lines stay; per-node monitoring is spread over each node's GPUs.
    fixed_usd = engineering + operations + f.monitoring_usd(0, 0.0, fixed_monitoring, hours)
    usd_per_gpu_hour = gpu_usd / gpu_hours if gpu_hours > 0 else 0.0
    monitor_per_gpu_hour = per_node / oh.monitoring.gpus_per_node / f.HOURS_PER_MONTH
    replica_usd = opts.replica_gpus * hours * (usd_per_gpu_hour + monitor_per_gpu_hour)
    tokens_per_gpu_hour = tokens / gpu_hours / util if gpu_hours > 0 and util > 0 else 0.0
    replica_tokens = opts.replica_gpus * hours * tokens_per_gpu_hour
    per_request = tokens / (usage.requests * scale) if usage.requests else None

    apis, api_scope = comparable_apis(book, opts, usage.model_params)
    comparisons = []
    for api in apis:
        api_total = f.api_usd(input_tokens, output_tokens, api.input_usd_per_mtok, api.output_usd_per_mtok)
        # The API's price per token at this traffic's input/output mix.
        per_token = api_total / tokens if tokens > 0 else (api.input_usd_per_mtok + api.output_usd_per_mtok) / 2e6
        be = f.break_even(fixed_usd, replica_usd, replica_tokens, per_token)
        comparisons.append({
            "api": f"{api.provider}/{api.model}", "input_usd_per_mtok": api.input_usd_per_mtok,
            "output_usd_per_mtok": api.output_usd_per_mtok, "source": api.source, "as_of": api.as_of,
            "api_usd": _r(api_total), "self_hosted_usd": _r(total), "self_hosting_saves_usd": _r(api_total - total),
            "break_even": _break_even_dict(be, hours, per_request)})

    return {
        "source": usage.source, "period": opts.period, "period_hours": hours, "window": usage.window,
        "slo": usage.slo, "model_params": usage.model_params, "api_scope": api_scope,
        "traffic": {"input_tokens": round(input_tokens), "output_tokens": round(output_tokens),
                    "input_tokens_per_day": round(input_tokens * 24 / hours),
                    "output_tokens_per_day": round(output_tokens * 24 / hours),
                    "requests": None if usage.requests is None else round(usage.requests * scale)},
        "gpus": [{**line, "gpu_hours": _r(line["gpu_hours"], 1), "usd": _r(line["usd"])} for line in gpu_lines],
        "gpu_hours": _r(gpu_hours, 1), "average_gpus": _r(gpu_hours / hours, 2), "nodes": nodes,
        "utilization": util, "utilization_from": util_from, "idle_gpu_usd": _r(gpu_usd * (1 - util)),
        "input_share": _r(share, 4), "input_share_from": share_from,
        "gpu_usd": _r(gpu_usd), "gpu_input_usd": _r(input_usd), "gpu_output_usd": _r(output_usd),
        "usd_per_mtok_input": _r(f.usd_per_mtok(input_usd, input_tokens), 4),
        "usd_per_mtok_output": _r(f.usd_per_mtok(output_usd, output_tokens), 4),
        "lines": {"gpus": _r(gpu_usd), "engineering": _r(engineering), "monitoring": _r(monitoring),
                  "operations": _r(operations)},
        "overheads": {"engineering_fte": fte, "loaded_annual_salary_usd": salary,
                      "monitoring_usd_per_node_month": per_node, "monitoring_fixed_usd_month": fixed_monitoring,
                      "operations_usd_month": ops_month},
        "total_usd": _r(total), "all_in_usd_per_mtok": _r(f.usd_per_mtok(total, tokens), 4),
        "replica_gpus": opts.replica_gpus, "api_comparisons": comparisons, "prices_note": book.note,
    }


def _break_even_dict(be: f.BreakEven, hours: float, tokens_per_request: float | None) -> dict:
    def per_day(v: float | None) -> float | None:
        return None if v is None else round(v * 24 / hours)

    def req_s(v: float | None) -> float | None:
        return None if v is None or not tokens_per_request else round(v / tokens_per_request / (hours * 3600), 3)

    return {"tokens_per_day": per_day(be.first_tokens), "replicas": be.first_replicas,
            "requests_per_s": req_s(be.first_tokens),
            "always_cheaper_from_tokens_per_day": per_day(be.all_tokens), "always_cheaper_replicas": be.all_replicas,
            "always_cheaper_from_requests_per_s": req_s(be.all_tokens), "reason": be.reason}
