"""`argosy cost`: $ per million tokens, cost of ownership, and break-even against hosted APIs."""

from __future__ import annotations

import argparse
import json
import math
import sys

from argosy.cost import usage as usage_from
from argosy.cost.estimate import CostOptions, estimate
from argosy.cost.prices import TIERS, load_prices
from argosy.cost.render import render


def add_cost_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("traffic (one of)")
    src.add_argument("--sim", metavar="RESULT.json",
                     help="an `argosy sim` result (its steady state: see --include-warmup)")
    src.add_argument("--plan", metavar="PLAN.json", help="an `argosy plan` result: the fleet it chose")
    src.add_argument("--bench", metavar="RESULT.json", help="an `argosy bench` result (with --gpu and --gpus)")
    src.add_argument("--input-tokens-per-s", type=float, help="steady input tokens/s (with the output rate)")
    src.add_argument("--output-tokens-per-s", type=float)
    src.add_argument("--input-tokens-per-day", type=float, help="input tokens/day (with the output volume)")
    src.add_argument("--output-tokens-per-day", type=float)
    hw = p.add_argument_group("GPUs")
    hw.add_argument("--gpu", help="GPU type for --bench and rates: H100, H200, B200, A100, L40S (as in the prices)")
    hw.add_argument("--gpus", type=float, help="GPUs serving the --bench run or the rates")
    hw.add_argument("--tier", default="on_demand",
                    help="on_demand (default), reserved, spot, or a mix: on_demand=0.3,reserved=0.7")
    hw.add_argument("--provider", help="price GPUs at this provider (default: the cheapest in the price file)")
    hw.add_argument("--gpus-per-replica", type=int, default=1,
                    help="GPUs of one replica (TP x PP): self-hosting grows in these steps (default 1)")
    c = p.add_argument_group("cost")
    c.add_argument("--prices", metavar="PRICES.yaml", help="a price file (default: the one shipped; copy and edit)")
    c.add_argument("--period", choices=["week", "month"], default="month", help="week = 168 h, month = 730 h")
    c.add_argument("--input-share", type=float,
                   help="share of GPU time spent on input tokens, 0-1 (default: the simulation's, else output "
                        "tokens weighted 4x)")
    c.add_argument("--utilization", type=float,
                   help="busy share of the GPU-hours, 0-1 (default: the simulation's, else 1: the traffic was "
                        "what the GPUs can serve)")
    c.add_argument("--engineering-fte", type=float, help="engineers' time on the fleet, in FTE")
    c.add_argument("--salary", type=float, help="loaded annual cost of one engineer, $/year")
    c.add_argument("--monitoring-per-node", type=float, help="monitoring, $/node/month")
    c.add_argument("--monitoring-fixed", type=float, help="monitoring, fixed $/month")
    c.add_argument("--operations", type=float, help="operations (storage, egress, tooling), $/month")
    c.add_argument("--api", help="compare with one API of the price file (provider/model; default: those serving "
                   "a model of comparable size, when the size is known)")
    c.add_argument("--all-apis", action="store_true",
                   help="compare with every API in the price file, whatever its model's size")
    c.add_argument("--include-warmup", action="store_true",
                   help="--sim: price the whole run, the warm-up included (default: the steady state after it)")
    c.add_argument("--allow-slo-miss", action="store_true",
                   help="--sim/--plan: price a fleet that missed its SLO anyway (with a warning); default: refuse")
    c.add_argument("--json", action="store_true", help="print the estimate as JSON")


def parse_tier_mix(text: str) -> dict[str, float]:
    """`reserved` -> {reserved: 1}; `on_demand=0.3,reserved=0.7` -> the shares (they must sum to 1)."""
    if "=" not in text:
        parts = {text.strip(): 1.0}
    else:
        parts = {}
        for item in text.split(","):
            name, _, share = item.partition("=")
            try:
                parts[name.strip()] = float(share)
            except ValueError:
                raise ValueError(f"--tier: {item!r} is not TIER=SHARE") from None
    unknown = [t for t in parts if t not in TIERS]
    if unknown:
        raise ValueError(f"--tier: unknown tier {unknown[0]!r}; tiers: {', '.join(TIERS)}")
    if any(s < 0 for s in parts.values()) or not math.isclose(sum(parts.values()), 1.0, abs_tol=1e-6):
        raise ValueError(f"--tier: shares must be >= 0 and sum to 1, got {text}")
    return parts


def _check_flags(args: argparse.Namespace) -> None:
    for name in ("input_share", "utilization"):
        v = getattr(args, name)
        if v is not None and not 0.0 <= v <= 1.0:
            raise ValueError(f"--{name.replace('_', '-')} must be between 0 and 1, got {v:g}")
    if args.utilization == 0:
        raise ValueError("--utilization must be above 0: idle GPUs serve no tokens")
    if args.gpus_per_replica < 1:
        raise ValueError("--gpus-per-replica must be at least 1")
    for name in ("engineering_fte", "salary", "monitoring_per_node", "monitoring_fixed", "operations",
                 "input_tokens_per_s", "output_tokens_per_s", "input_tokens_per_day", "output_tokens_per_day"):
        v = getattr(args, name)
        if v is not None and not (v >= 0 and math.isfinite(v)):
            raise ValueError(f"--{name.replace('_', '-')} must be a number >= 0, got {v:g}")


def _usage(args: argparse.Namespace) -> usage_from.Usage:
    per_s = args.input_tokens_per_s is not None or args.output_tokens_per_s is not None
    per_day = args.input_tokens_per_day is not None or args.output_tokens_per_day is not None
    chosen = [n for n, on in (("--sim", args.sim), ("--plan", args.plan), ("--bench", args.bench),
                              ("--input/output-tokens-per-s", per_s), ("--input/output-tokens-per-day", per_day)) if on]
    if len(chosen) != 1:
        raise ValueError("give the traffic one way: --sim RESULT.json, --plan PLAN.json, --bench RESULT.json, "
                         "--input-tokens-per-s with --output-tokens-per-s, or the two per-day volumes"
                         + (f" (got {' and '.join(chosen)})" if chosen else ""))
    if args.sim or args.plan:
        if args.gpu or args.gpus:
            raise ValueError("--gpu/--gpus do not apply to --sim/--plan: the result names its GPUs")
        usage = usage_from.from_sim(args.sim, args.include_warmup) if args.sim else usage_from.from_plan(args.plan)
        if usage.slo is not None and usage.slo.get("met") is False and not args.allow_slo_miss:
            raise ValueError(
                f"{args.sim or args.plan}: the fleet missed its SLO (attainment {usage.slo['attainment'] * 100:.1f}%, "
                f"target {usage.slo.get('attainment_target', 0) * 100:.0f}%): its cost is not the cost of serving "
                "this traffic. Find a fleet that passes (argosy plan, or more replicas), or pass --allow-slo-miss "
                "to price it anyway")
        return usage
    if not args.gpu or not args.gpus or args.gpus <= 0:
        raise ValueError(f"{chosen[0]} needs --gpu TYPE and --gpus N (N > 0): the GPUs that serve it")
    if args.bench:
        return usage_from.from_bench(args.bench, args.gpu, args.gpus)
    if per_s:
        rates = (args.input_tokens_per_s, args.output_tokens_per_s)
    else:
        rates = tuple(None if v is None else v / 86400 for v in (args.input_tokens_per_day, args.output_tokens_per_day))
    if None in rates:
        raise ValueError("give both the input and the output token rate (or both per-day volumes)")
    return usage_from.from_rates(args.gpu, args.gpus, *rates)


def run_cost(args: argparse.Namespace) -> int:
    try:
        _check_flags(args)
        tier_mix = parse_tier_mix(args.tier)
        book = load_prices(args.prices)
        usage = _usage(args)
        opts = CostOptions(period=args.period, tier_mix=tier_mix, provider=args.provider,
                           input_share=args.input_share, utilization=args.utilization,
                           replica_gpus=args.gpus_per_replica, api=args.api, all_apis=args.all_apis,
                           engineering_fte=args.engineering_fte,
                           loaded_annual_salary_usd=args.salary, monitoring_usd_per_node_month=args.monitoring_per_node,
                           monitoring_fixed_usd_month=args.monitoring_fixed, operations_usd_month=args.operations)
        est = estimate(usage, book, opts)
    except ValueError as e:  # PriceError and UsageError are ValueErrors: one line, no traceback
        sys.stderr.write(f"argosy cost: error: {e}\n")
        return 2
    print(json.dumps(est, indent=1) if args.json else render(est))
    return 0
