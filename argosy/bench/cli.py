"""`argosy bench`: load-test an OpenAI-compatible server; `argosy bench report FILE` re-renders a run."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from argosy.bench import results
from argosy.bench.client import Endpoint
from argosy.bench.metrics import parse_slos
from argosy.bench.progress import Progress
from argosy.bench.runner import LoadLevel, Run, RunLimits
from argosy.bench.workload import DISTRIBUTIONS, LengthDist, SyntheticWorkload, load_trace


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _ramp(text: str) -> tuple[float, float]:
    a, sep, b = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError("use FROM:TO, e.g. 1:16")
    return float(a), float(b)


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    # dest bench_command: the host parser's sub-commands may already use args.command
    p.add_argument("bench_command", nargs="?", choices=["run", "report"], default="run", metavar="{run,report}",
                   help="run (default) a benchmark, or report: re-render a results JSON")
    p.add_argument("results_file", nargs="?", help="for report: the results JSON")
    t = p.add_argument_group("target")
    t.add_argument("--url", help="server base URL, e.g. http://127.0.0.1:8000")
    t.add_argument("--model", help="model name to send (default: the first of GET /v1/models)")
    t.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                   help="/v1/completions (default) or /v1/chat/completions")
    t.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token ($OPENAI_API_KEY)")
    t.add_argument("--timeout", type=float, default=600.0, help="seconds a request may take (default 600)")
    t.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="do not send ignore_eos (a vLLM extra field; outputs may then end before max_tokens)")
    t.add_argument("--temperature", type=float, default=0.0)
    t.add_argument("--extra-body", type=json.loads, default={}, help="JSON object merged into every request")
    t.add_argument("--max-connections", type=int, default=0, help="connection pool size (0: unbounded)")
    ld = p.add_argument_group("load (one of)")
    ld.add_argument("--rate", type=_floats, help="open loop at R req/s; a list (1,2,4,8) sweeps; inf: all at once")
    ld.add_argument("--burstiness", type=float, default=1.0,
                    help="gamma shape of the arrival gaps: 1 Poisson (default), <1 burstier, >1 more even")
    ld.add_argument("--concurrency", type=_ints, help="closed loop with N requests in flight; a list sweeps")
    ld.add_argument("--ramp", type=_ramp, help="open loop, rate rising linearly FROM:TO req/s over the run")
    ld.add_argument("--trace", help="replay a JSONL trace: {timestamp, prompt | prompt_tokens, output_tokens}")
    ld.add_argument("--trace-speedup", type=float, default=1.0, help="divide the trace's timestamps by this")
    lim = p.add_argument_group("length of each run")
    lim.add_argument("--duration", type=float, help="seconds of arrivals per run")
    lim.add_argument("--num-requests", type=int, help="requests per run (default 100 without --duration)")
    w = p.add_argument_group("workload")
    for name, default in (("prompt", 128), ("output", 64)):
        w.add_argument(f"--{name}-tokens", type=int, default=default, help=f"mean {name} tokens (default {default})")
        w.add_argument(f"--{name}-dist", choices=DISTRIBUTIONS, default=None,
                       help="length distribution (default fixed; uniform when a spread is given)")
        w.add_argument(f"--{name}-spread", type=float, default=0.0,
                       help="relative spread: uniform +-S*mean, normal std S*mean, lognormal sigma S")
    w.add_argument("--shared-prefix-tokens", type=int, default=0, help="a shared system prompt of this many tokens")
    w.add_argument("--num-prefixes", type=int, default=1, help="how many different shared prefixes")
    w.add_argument("--turns", type=int, default=1, help="turns per chat session (each resends the history)")
    w.add_argument("--seed", type=int, default=0)
    o = p.add_argument_group("results")
    o.add_argument("--slo", help="SLOs for goodput, e.g. ttft=2s,tpot=100ms,e2e=20s")
    o.add_argument("--output", "-o", default="argosy-bench.json", help="results JSON (default argosy-bench.json)")
    o.add_argument("--html", help="also write a self-contained HTML report here")
    o.add_argument("--no-progress", dest="progress", action="store_false", help="no progress line on stderr")


def _levels(args: argparse.Namespace) -> list[LoadLevel]:
    chosen = [n for n in ("rate", "concurrency", "ramp", "trace") if getattr(args, n) is not None]
    if len(chosen) != 1:
        raise ValueError("choose one load: --rate, --concurrency, --ramp or --trace")
    if args.rate is not None:
        return [LoadLevel(f"rate {r:g} req/s", rate=r, burstiness=args.burstiness) for r in args.rate]
    if args.concurrency is not None:
        return [LoadLevel(f"concurrency {c}", concurrency=c) for c in args.concurrency]
    if args.ramp is not None:
        a, b = args.ramp
        return [LoadLevel(f"ramp {a:g} -> {b:g} req/s", ramp=(a, b), burstiness=args.burstiness)]
    return [LoadLevel(f"trace {os.path.basename(args.trace)}", trace=True, trace_speedup=args.trace_speedup)]


def _check_flags(args: argparse.Namespace) -> None:
    """Numbers no run can use, refused in one line before the server is asked anything (a negative
    --concurrency ran one stream, a NaN --duration never ended, --max-connections -1 hung)."""
    def positive(name: str, v: float | None, finite: bool = True) -> None:
        if v is not None and not (v > 0 and (math.isfinite(v) or not finite)):
            raise ValueError(f"--{name} must be a {'finite ' if finite else ''}number > 0, got {v:g}")

    for c in args.concurrency or []:
        if c < 1:
            raise ValueError(f"--concurrency must be at least 1, got {c}")
    for r in args.rate or []:
        positive("rate", r, finite=False)  # inf: every request at once
    for r in args.ramp or ():
        if not (r >= 0 and math.isfinite(r)):
            raise ValueError(f"--ramp rates must be finite and >= 0, got {r:g}")
    if args.ramp is not None and not sum(args.ramp) > 0:
        raise ValueError("--ramp 0:0 sends nothing: give a rate above 0 at one end")
    for name in ("duration", "timeout", "trace_speedup", "burstiness"):
        positive(name.replace("_", "-"), getattr(args, name))
    for name, low in (("num_requests", 1), ("max_connections", 0), ("turns", 1), ("num_prefixes", 1),
                      ("shared_prefix_tokens", 0)):
        v = getattr(args, name)
        if v is not None and v < low:
            raise ValueError(f"--{name.replace('_', '-')} must be at least {low}, got {v}")


def _jobs_factory(args: argparse.Namespace) -> Callable[[int | None], Any]:
    if args.trace:
        jobs = load_trace(args.trace, default_output_tokens=args.output_tokens, seed=args.seed)
        return lambda _n: iter(jobs)

    def dist(name: str) -> LengthDist:
        spread = getattr(args, f"{name}_spread")
        kind = getattr(args, f"{name}_dist") or ("uniform" if spread else "fixed")
        return LengthDist(getattr(args, f"{name}_tokens"), kind, spread)

    wl = SyntheticWorkload(dist("prompt"), dist("output"), seed=args.seed, turns=args.turns,
                           shared_prefix_tokens=args.shared_prefix_tokens, num_prefixes=args.num_prefixes)
    return wl.jobs


def _first_model(base_url: str, api_key: str | None, need: bool = True) -> str | None:
    """The server's first model (its /v1/models); checks the server answers at all before any load is sent.
    An unreachable URL is a ValueError (one line), not a traceback."""
    import httpx

    base = base_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{base}/v1/models", headers=headers, timeout=10)
    except httpx.HTTPError as e:
        reason = str(e) or type(e).__name__
        raise ValueError(f"cannot reach {base} ({reason}): is the server running, and is the URL right?") from None
    if not need:
        return None
    try:
        return r.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ValueError(f"{base}/v1/models answered {r.status_code} without a model: pass --model") from None


def _run_async(coro_fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    try:  # uvloop when present: a cheaper event loop keeps the client off the critical path
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro_fn())


def _report(args: argparse.Namespace) -> int:
    if not args.results_file:
        raise ValueError("usage: argosy bench report RESULTS.json [--slo ...] [--html OUT.html]")
    result = results.load(args.results_file, parse_slos(args.slo) if args.slo else None)
    print(results.render(result))
    if args.html:
        from argosy.bench.html_report import write_html
        write_html(result, args.html)
        print(f"HTML report: {args.html}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    if not args.url:
        raise ValueError("--url is required")
    slos = parse_slos(args.slo)
    levels = _levels(args)
    _check_flags(args)
    if args.duration is None and args.num_requests is None and not args.trace:
        args.num_requests = 100
    jobs = _jobs_factory(args)  # a trace file's mistakes before the server is asked
    model = _first_model(args.url, args.api_key, need=not args.model) or args.model
    ep = Endpoint(args.url, model, args.endpoint, args.api_key, args.ignore_eos, args.temperature, args.timeout,
                  args.extra_body)
    limits = RunLimits(args.duration, args.num_requests, args.seed)
    # The flags, minus the secret and whatever the host command added that JSON cannot hold.
    config = {k: v for k, v in vars(args).items() if k not in ("api_key", "bench_command", "results_file")
              and isinstance(v, str | int | float | bool | list | tuple | dict | None)}
    config.update(model=model, request_url=ep.url, slo_ms=slos)
    runs, interrupted = [], False
    gc.freeze()  # what exists now is never garbage: fewer, shorter collections during the runs
    try:
        for level in levels:
            progress = Progress(level.label, limits.num_requests, limits.duration_s,
                                None if args.progress else False)
            run = Run(ep, level, limits, jobs(limits.num_requests), progress, args.max_connections)
            cpu0 = time.process_time()
            try:
                records = _run_async(run.execute)
            except KeyboardInterrupt:  # Ctrl-C: asyncio.Runner cancelled the run; what finished is kept
                interrupted = True
                records = run.records
            # The load generator's own CPU over the run (its interpreter start and imports left out): on
            # a machine it shares with the server, what the server lacked.
            client_cpu_s = round(time.process_time() - cpu0, 4)
            level_info = {"rate": level.rate, "concurrency": level.concurrency, "burstiness": level.burstiness,
                          "ramp": level.ramp, "started_unix": run.started_unix, "client_cpu_s": client_cpu_s}
            if interrupted:
                # Requests cut off mid-flight have neither an answer nor an error of the server's: left out of
                # the figures, and counted.
                level_info["interrupted"] = {"in_flight": sum(1 for r in records if not r.ok and not r.error_kind)}
                records = [r for r in records if r.ok or r.error_kind]
            entry = results.run_entry(level.label, level_info, records, slos)
            runs.append(entry)
            print(results.render_run(entry), flush=True)
            _warn_if_lagging(entry["summary"])
            if interrupted:
                break
    finally:
        gc.unfreeze()
    result = results.build(config, runs, slos)
    if result["sweep"]:
        print("\n" + results.render_sweep(result["sweep"]))
    results.save(result, args.output)
    print(f"results: {args.output}")
    if args.html:
        from argosy.bench.html_report import write_html
        write_html(result, args.html)
        print(f"HTML report: {args.html}")
    if interrupted:
        return 130  # as a shell reports a Ctrl-C
    return 0 if any(r["summary"]["completed"] for r in runs) else 1


def _warn_if_lagging(s: dict) -> None:
    lag = s["send_lag_ms"]
    if lag and s["late_sends"] > max(1, math.ceil(0.01 * s["requests"])):
        sys.stderr.write(f"warning: {s['late_sends']} of {s['requests']} requests were sent more than 10 ms late "
                         f"(p99 send lag {lag['p99']:.1f} ms): the client may be the bottleneck at this rate\n")


def run_bench(args: argparse.Namespace) -> int:
    try:
        return _report(args) if args.bench_command == "report" else _bench(args)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"argosy bench: error: {e}\n")
        return 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="argosy bench", description=__doc__)
    add_bench_arguments(p)
    return run_bench(p.parse_args(argv))
