"""`argosy sim` and `argosy plan` (`argosy profile`: profile_cli.py)."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from argosy.sim.cli_common import add_roofline, csv_of, fail, log, roofline_settings, seconds

# ---------------------------------------------------------------------------- sim and plan: common inputs

def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="fleet file (default: all defaults)")
    p.add_argument("--traffic", required=True, help="traffic file (docs/sim.md)")
    p.add_argument("--name", help="the model to simulate (default: the fleet file's first)")
    p.add_argument("--slo-ttft", "--slo-ttft-p99", type=seconds, default=2.0, help="TTFT SLO (2s)")
    p.add_argument("--slo-tpot", "--slo-tpot-p99", type=seconds, default=0.1, help="TPOT SLO (100ms)")
    p.add_argument("--attainment", type=float, default=0.9, help="share of requests meeting both SLOs (0.9)")
    p.add_argument("--prices", help="price book (default: the cost package's)")
    p.add_argument("--price-tier", default="on_demand", help="on_demand | reserved | spot")
    p.add_argument("--provider", help="cloud provider in the price book")
    p.add_argument("--output", "-o", help="result JSON")
    p.add_argument("--html", help="self-contained HTML report with plots")


def _inputs(args):
    from argosy.config import ModelConfig, load_fleet
    from argosy.sim.results import SLO
    from argosy.sim.traffic import load_traffic

    fleet = load_fleet(args.config) if args.config else None
    models = fleet.models if fleet else []
    if args.name:
        match = [m for m in models if m.name == args.name]
        if not match:
            raise ValueError(f"no model {args.name!r} in {args.config} ({', '.join(m.name for m in models) or 'none'})")
        model = match[0]
    else:
        model = models[0] if models else ModelConfig(name="default")
    if not 0 < args.attainment <= 1:
        raise ValueError("--attainment must be in (0, 1]")
    if not (args.slo_ttft > 0 and args.slo_tpot > 0):  # 0 had passed: "SLO attainment: 0.0%"
        raise ValueError("--slo-ttft and --slo-tpot must be more than 0")
    _check_prices(args)
    for flag, path in (("--output", args.output), ("--html", getattr(args, "html", None))):
        folder = Path(path).resolve().parent if path else None
        if folder is not None and not (folder.is_dir() and os.access(folder, os.W_OK)):
            raise ValueError(f"{flag} {path}: {folder} is not a folder this user can write to")  # said before the run
    args.fleet = fleet if fleet is not None and fleet.regions else None  # regions: the gateways' routing decides
    spec = load_traffic(args.traffic)
    if args.fleet is not None:
        known = {r.name for r in args.fleet.regions}
        unknown = [r.name for r in spec.regions if r.name not in known]
        if unknown:
            raise ValueError(f"{args.traffic}: regions {', '.join(unknown)} are not regions of {args.config} "
                             f"({', '.join(sorted(known))})")
    return model, spec, SLO(args.slo_ttft, args.slo_tpot, None, args.attainment)


def _fits(reqs, profile) -> None:
    """A request no replica's KV cache can hold is one a server refuses (400): the sim had kept such requests
    waiting (100M-token prompts took 11.7 GB before any step), then reported them as merely unfinished."""
    from argosy.sim.traffic import TrafficError

    cap = profile.num_blocks * profile.block_size
    longest = max((p + o for p, o in zip(reqs.prompt_tokens, reqs.output_tokens, strict=True)), default=0)
    if longest > cap:
        raise TrafficError(f"a request of {longest:,} tokens (prompt and output) is more than a replica's KV cache "
                           f"holds ({cap:,} tokens on {profile.name}): a server refuses it; shorten the traffic's "
                           "prompt_tokens or output_tokens")


def _check_prices(args) -> None:
    """The tier and provider the cost line is priced at: a wrong one had dropped the line without a word."""
    from argosy.cost.prices import TIERS, PriceError, load_prices

    if args.price_tier not in TIERS:
        raise ValueError(f"--price-tier: unknown tier {args.price_tier!r}; tiers: {', '.join(TIERS)}")
    if args.provider is not None:
        try:
            providers = load_prices(args.prices).providers
        except PriceError as e:
            raise ValueError(f"--prices: {e}") from None
        if args.provider.lower() not in {p.lower() for p in providers}:
            raise ValueError(f"--provider: unknown provider {args.provider!r}; the price book has: "
                             f"{', '.join(providers)}")


def _write(args, res: dict, text: str, kind: str, title: str) -> None:
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(res, f, indent=1)
        print(f"result JSON -> {args.output}")
    if args.html:
        from argosy.sim.report import write_html

        write_html(args.html, title, text, res, kind)
        print(f"HTML report -> {args.html}")


# ---------------------------------------------------------------------------- sim

def add_sim_arguments(p: argparse.ArgumentParser) -> None:
    _add_common(p)
    p.add_argument("--profile", help="a profile JSON from `argosy profile`")
    p.add_argument("--gpu", help="or a roofline profile for this accelerator (with --model-config)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--replicas", type=int, help="fixed replicas per region (default: the autoscaler decides)")
    p.add_argument("--warmup", type=_warmup, default=None, metavar="DURATION",
                   help="left out of latencies and of the steady-state cost window (default: a tenth of the run, "
                        "with the autoscaler at least two cold starts, at most half the run)")
    p.add_argument("--node-cores", type=float, default=None, metavar="CORES",
                   help="CPU replicas sharing one node of this many cores: busy replicas (and, with a profile "
                        "from `argosy profile --node`, the CPU their tokens cost the gateway and event loops) "
                        "slow each other down (default: each replica has its own hardware)")
    p.add_argument("--replica-threads", type=float, default=1.0, metavar="THREADS",
                   help="with --node-cores: the threads each replica's engine runs (1)")
    p.add_argument("--week", action="store_true", help="plan a week from its distinct hourly load levels")
    p.add_argument("--level-duration", type=seconds, default=60.0,
                   help="--week: seconds simulated per level, the first third a warm-up (60)")
    p.add_argument("--level-step", type=float, default=0.05, help="--week: levels rounded to this share of the peak")
    add_roofline(p)


def _warmup(text: str) -> float:
    v = seconds(text)
    if v < 0:
        raise argparse.ArgumentTypeError("--warmup must be >= 0")
    return v


def _profile(args):
    from argosy.sim.profile import load_profile, model_shape, roofline_profile

    if (args.profile is None) == (args.gpu is None):
        raise ValueError("give --profile FILE or --gpu NAME --model-config M")
    if args.profile:
        return load_profile(args.profile)
    if args.model_config is None:
        raise ValueError("--gpu needs --model-config (a catalogue model, checkpoint folder or config.json)")
    return roofline_profile(args.gpu, model_shape(args.model_config), args.tp, roofline_settings(args))


def run_sim(args: argparse.Namespace) -> int:
    from argosy.sim.fleet import FleetSim, SimSettings
    from argosy.sim.results import auto_warmup_s, gpu_prices, render_text, summarize
    from argosy.sim.traffic import TrafficError, make_requests
    from argosy.sim.week import plan_week

    try:
        model, spec, slo = _inputs(args)
        profile = _profile(args)
        if args.replicas is not None and args.replicas < 1:
            raise ValueError("--replicas must be at least 1")
    except (ValueError, FileNotFoundError) as e:
        return fail("sim", e)
    prices = gpu_prices([profile.gpu], args.price_tier, args.provider, args.prices)
    if args.node_cores is not None and not (args.node_cores > 0 and args.replica_threads > 0):
        return fail("sim", ValueError("--node-cores and --replica-threads must be > 0"))
    if args.node_cores is not None and not profile.node_token_cpu_table:
        log("note: the profile has no node CPU figures (`argosy profile --node`): only the engines' threads "
             "share the node's cores, so a busy node is predicted faster than it is")
    settings = SimSettings(replicas=args.replicas, sample_s=max(1.0, spec.duration_s / 2000),
                           node_cores=args.node_cores, replica_threads=args.replica_threads)
    t0 = time.perf_counter()
    if args.week:
        try:
            res = plan_week(model, profile, spec, slo, settings=settings, level_s=args.level_duration,
                            warmup_s=args.level_duration / 3, level_step=args.level_step, progress=log,
                            fleet=args.fleet)
        except TrafficError as e:
            return fail("sim", e)
        res["cost"] = ({"usd": round(sum(h * prices[g] for g, h in res["gpu_hours"].items()), 2)}
                       if prices else None)
        text = (f"week: {res['hours']} hours from {len(res['levels'])} levels; attainment {res['attainment']:.3f}; "
                f"p99 TTFT (hour-weighted) {(res['ttft_s']['p99'] or 0) * 1000:.0f} ms; GPU-hours "
                + ", ".join(f"{g} {h:.1f} h" for g, h in res["gpu_hours"].items())
                + (f"; cost ${res['cost']['usd']:.2f}" if res["cost"] else "")
                + f"\n(wall time {time.perf_counter() - t0:.1f} s)")
        _write(args, res, text, "week", "argosy sim --week")
        return 0
    try:
        reqs = make_requests(spec)
        _fits(reqs, profile)
    except TrafficError as e:
        return fail("sim", e)
    log(f"simulating {len(reqs)} requests over {spec.duration_s:g} s on {profile.name}")

    def progress(now: float, i: int, n: int) -> None:
        log(f"  {now:.0f}/{spec.duration_s:g} s simulated, {i}/{n} requests, "
             f"{now / (time.perf_counter() - t0):.1f}x real time")

    warmup = args.warmup
    if warmup is None:
        warmup = auto_warmup_s(spec.duration_s, profile.cold_start_s, autoscaled=args.replicas is None)
    if warmup >= spec.duration_s:
        msg = f"--warmup ({warmup:g} s) must be shorter than the traffic ({spec.duration_s:g} s)"
        return fail("sim", ValueError(msg))
    sim = FleetSim(model, profile, spec, reqs, settings, fleet=args.fleet)
    sim.run(progress)
    res = summarize(sim, slo, warmup_s=warmup, prices=prices)
    wall = time.perf_counter() - t0
    res["wall_s"] = wall
    text = render_text(res) + f"\n(wall time {wall:.1f} s: {spec.duration_s / wall:.1f}x real time)"
    _write(args, res, text, "run", "argosy sim")
    return 0


# ---------------------------------------------------------------------------- plan

def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    _add_common(p)
    p.add_argument("--gpus", type=csv_of(str), default=("H100",), help="accelerators to try (H100,A100,...)")
    p.add_argument("--tp", type=csv_of(int), default=(1,), help="TP sizes to try (1,2)")
    p.add_argument("--max-num-seqs", type=csv_of(int), default=(256,), help="batch limits to try (128,256)")
    p.add_argument("--policies", type=csv_of(str), default=("least_load",), help="routing policies to try")
    p.add_argument("--max-replicas", type=int, default=64, help="per region (64)")
    p.add_argument("--jobs", "-j", type=int, default=None,
                   help="configurations simulated at once, each in its own process (default: this machine's cores)")
    p.add_argument("--spot-notice", type=seconds, default=30.0, metavar="DURATION",
                   help="with regions that list capacity: the notice a preempted spot replica gets in the capacity "
                        "mix's check (30s; AWS gives 2 minutes)")
    p.add_argument("--spare", choices=["none", "replica", "region"], default="none",
                   help="grow the chosen fleet until it survives the loss of a replica in any region, or of a "
                        "whole region (default none: the fewest that pass, and the answer says what they survive)")
    add_roofline(p)


def run_plan(args: argparse.Namespace) -> int:
    from argosy.gateway.routing.presets import POLICY_NAMES
    from argosy.sim.plan import PlanSpace, brief, search
    from argosy.sim.plan_answer import answer, render_plan
    from argosy.sim.plan_checks import checks, headroom
    from argosy.sim.profile import load_catalogue, model_shape
    from argosy.sim.results import gpu_prices
    from argosy.sim.traffic import TrafficError, make_requests

    try:
        model, spec, slo = _inputs(args)
        if args.model_config is None:
            raise ValueError("plan needs --model-config (a catalogue model, checkpoint folder or config.json)")
        shape = model_shape(args.model_config)
        bad = [x for x in args.policies if x not in POLICY_NAMES]
        if bad:
            raise ValueError(f"unknown routing policy {bad[0]!r}: {', '.join(POLICY_NAMES)}")
        if args.max_replicas < 1:
            raise ValueError("--max-replicas must be at least 1")
        if args.jobs is not None and args.jobs < 1:
            raise ValueError("--jobs must be at least 1")
        if min(args.tp) < 1 or min(args.max_num_seqs) < 1:
            raise ValueError("--tp and --max-num-seqs must be at least 1")
        known = load_catalogue()["accelerators"]
        unknown = [g for g in args.gpus if g not in known]
        if unknown:  # a typo is a mistake to say, not a configuration to skip
            raise ValueError(f"unknown accelerator {unknown[0]!r}: one of {', '.join(known)} "
                             "(argosy/sim/catalogue.yaml)")
        space = PlanSpace(tuple(args.gpus), tuple(args.tp), tuple(args.max_num_seqs), tuple(args.policies),
                          args.max_replicas, args.spare)
        settings = roofline_settings(args)
    except (ValueError, FileNotFoundError) as e:
        return fail("plan", e)

    def price(gpu: str) -> float | None:
        got = gpu_prices([gpu], args.price_tier, args.provider, args.prices)
        return got[gpu] if got else None

    from argosy.sim.capacity_mix import peak_spec, plan_mix, render_mix

    week, spec = spec, peak_spec(spec)  # a week's curve: the search sizes its peak
    try:
        reqs = make_requests(spec)
    except TrafficError as e:
        return fail("plan", e)
    log(f"planning for {len(reqs)} requests over {spec.duration_s:g} s")
    res = search(model, shape, spec, reqs, slo, space, settings, price, progress=log, fleet=args.fleet,
                 jobs=args.jobs)
    trials = res.pop("trials")

    def run_checks(c: dict) -> dict:
        log(f"checking {c['label']} against the loss of a replica and of a region")
        trial = trials[c["label"]]
        return checks(trial, c, lambda counts: trial.candidate(counts))

    def run_headroom(c: dict) -> dict:
        return headroom(trials[c["label"]], c["replicas"], log)

    res["answer"] = answer(res, shape.params, args.price_tier, args.provider, args.prices, run_checks, run_headroom)
    chosen = res["cheapest"]
    res["load_curve"] = chosen["timeline"] if chosen else []  # the peak traffic and the replicas that serve it
    res["cheapest"] = brief(chosen) if chosen else None
    for key in ("passing", "frontier", "candidates"):
        res[key] = [brief(c) for c in res[key]]
    res["model"] = {"name": shape.name, "params": shape.params}
    text = render_plan(res)
    if chosen is not None and args.fleet is not None and any(r.capacity for r in args.fleet.regions):
        def book(kind: str, provider: str | None) -> float | None:
            got = gpu_prices([chosen["gpu"]], kind, provider, args.prices) or \
                gpu_prices([chosen["gpu"]], kind, None, args.prices)
            return got[chosen["gpu"]] if got else None

        log(f"capacity mix: {chosen['label']} over the week's hours, spot preemptions simulated at the peak")
        res["capacity_mix"] = plan_mix(trials[chosen["label"]], chosen, args.fleet, week, book, args.spot_notice,
                                       (res["answer"]["checks"] or {}).get("region_loss"), log)
        text += "\n" + render_mix(res["capacity_mix"])
    _write(args, res, text, "plan", "argosy plan")
    return 0
