"""Prediction, not a fit: the simulator against a real autoscaled fleet, at loads it was not fitted to.

1. profile ONE replica of the built-in model at low load (`argosy profile --node`: the engine sweep, the
   served replica, and the node's CPU per token outside the engines, at 1 to 16 streams behind
   `argosy serve`; plus one replica's start-to-ready time): the only measurement the sim is given;
2. for three loads (30, 60 and 90% of what the profile says three replicas serve) and one bursty trace,
   start a fresh `argosy serve` (the fleet file below: prefix routing, autoscaling 1..3 replicas on
   concurrency), drive it with `argosy bench --trace`, and poll its replica count every second;
3. replay the same requests (the bench's send times and the server's token counts) in `argosy sim`
   with the profile, the same fleet file and the same autoscaler, the replicas sharing this machine's
   cores as the real ones do (`--node-cores`: one engine thread each, plus the profile's CPU per token
   for the gateway, the event loops and the load generator), with nothing refitted;
4. print measured against predicted TTFT p50/p90, TPOT p50, output throughput and the mean number of ready
   replicas, with % errors (target: each within 15%), and how fast the host ran a fixed piece of work around
   each load against at the profile (a shared VM's speed moves under everything);
5. profile again after the last load, with nothing else changed, and predict every load a second time from
   that profile: the first profile is the prediction (the target is read on it); the second says how much
   of the error is the host having moved between the profile and the fleet. With --repeat, each trace
   is served a second time on a fresh fleet and the two measurements are compared too: how far the real
   fleet is from itself on this machine, which no prediction can be expected to beat.

    .venv/bin/python bench/sim_prediction.py [--duration 90] [--node-cores 2] [--loads 0.3,0.6,0.9] [--repeat]

Run it on a quiet machine: every replica, the gateway and the load generator share its cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ENGINE = {"max_num_seqs": 32, "max_num_batched_tokens": 512, "kv_cache_memory_gib": 0.5}
AUTOSCALING = {"min_replicas": 1, "max_replicas": 3, "metric": "concurrency", "target": 4, "target_utilization": 0.7,
               "stable_window_s": 20, "panic_window_s": 4, "scale_down_delay_s": 10, "tick_s": 1}
SHAPE = {"prompt_tokens": {"mean": 128, "dist": "uniform", "spread": 0.5},
         "output_tokens": {"mean": 64, "dist": "uniform", "spread": 0.5}}


def fleet_file(tmp: Path, ckpt: str) -> Path:
    import yaml

    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump({"models": [{"name": "builtin", "checkpoint": ckpt, "engine": ENGINE,
                                                "routing": {"policy": "prefix"}, "autoscaling": AUTOSCALING}]}))
    return path


def profile_once(ckpt: str, log) -> object:
    """The engine sweep, the served replica, and a replica's start-to-ready time: all at low load."""
    from argosy.sim.measure import measure_profile
    from argosy.sim.measure_node import measure_node
    from argosy.sim.measure_serving import free_port, measure_serving, wait_ready

    kw = {"max_num_seqs": ENGINE["max_num_seqs"], "token_budget": ENGINE["max_num_batched_tokens"],
          "kv_cache_memory_gib": ENGINE["kv_cache_memory_gib"]}
    prof = measure_serving(ckpt, measure_profile(ckpt, log=log, **kw), log=log, **kw)
    prof = measure_node(ckpt, prof, log=log, **kw)  # the gateway's, event loops' and client's CPU per token
    port, t0 = free_port(), time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "argosy.cli", "engine", "--model", ckpt, "--port", str(port),
                             "--max-num-seqs", "32", "--max-num-batched-tokens", "512", "--kv-cache-memory", "0.5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        cold = time.monotonic() - t0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    log(f"a replica's start to ready: {cold:.1f} s")
    import dataclasses

    return dataclasses.replace(prof, cold_start_s=cold)


def host_work_s(samples: int = 21) -> float:
    """Seconds a fixed piece of Python work takes on this host (the median of `samples`, a little apart): taken
    at the profile and around each load, it says whether the host itself changed speed between them (on a
    shared VM it does, by up to 2x within a minute), which no prediction from the profile can know."""
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        x = 0
        for i in range(200_000):
            x += i
        times.append(time.perf_counter() - t)
        time.sleep(0.02)
    return float(np.median(times))


def sim_run(prof, fleet_path: Path, spec, node_cores: float, replicas: int | None = None):
    from argosy.config import load_fleet
    from argosy.sim.fleet import FleetSim, SimSettings
    from argosy.sim.results import SLO, summarize
    from argosy.sim.traffic import make_requests

    model = load_fleet(fleet_path).models[0]
    sim = FleetSim(model, prof, spec, make_requests(spec), SimSettings(replicas=replicas, sample_s=1.0,
                                                                       node_cores=node_cores, replica_threads=1))
    sim.run()
    return sim, summarize(sim, SLO())


def capacity(prof, fleet_path: Path, node_cores: float) -> float:
    """Requests/s three replicas complete when flooded (the sim's own estimate, from the profile alone)."""
    from argosy.sim.traffic import TrafficSpec

    spec = TrafficSpec(duration_s=30, rate=200, **SHAPE)
    sim, _ = sim_run(prof, fleet_path, spec, node_cores, replicas=3)
    last = max(r.finish_s for r in sim.done)
    return len(sim.done) / last


def serve_and_bench(fleet_path: Path, trace: Path, out: Path) -> tuple[list[tuple[float, int]], dict]:
    """A fresh `argosy serve`, the trace through `argosy bench`: the ready-replica count each second, and the
    CPU seconds the node spent over the bench in the engines' threads and outside them (the gateway, the
    replicas' event loops, the bench as it counts itself; a replica started meanwhile is in both)."""
    from argosy.sim.measure_node import CpuWatch, start_serve, stop_serve

    proc, url = start_serve(fleet_path)  # returns once a replica is ready
    counts: list[tuple[float, int]] = []
    stop = threading.Event()

    def ready() -> int:
        with urllib.request.urlopen(url + "/admin/fleet", timeout=2) as r:
            models = json.loads(r.read())["models"]
        return sum(1 for rep in models[0]["replicas"] if rep["state"] == "ready" and not rep.get("pooled"))

    def poll(t0: float, watch) -> None:
        while not stop.is_set():
            try:
                counts.append((time.monotonic() - t0, ready()))
            except OSError:
                pass
            watch.look()
            stop.wait(1.0)

    try:
        t0, watch = time.monotonic(), CpuWatch(proc.pid)
        poller = threading.Thread(target=poll, args=(t0, watch), daemon=True)
        poller.start()
        subprocess.run([sys.executable, "-m", "argosy.cli", "bench", "--url", url, "--model", "builtin", "--trace",
                        str(trace), "--seed", "1", "-o", str(out)], check=True, stdout=subprocess.DEVNULL)
        stop.set()
        poller.join()
        watch.look()
    finally:
        stop.set()
        stop_serve(proc)
    cpu = watch.spent()
    cpu["outside"] += json.loads(out.read_text())["runs"][0]["client_cpu_s"]
    return counts, cpu


def mean_replicas(points: list[tuple[float, float]], end: float) -> float:
    """Time-weighted mean of a step function given as (t, value) samples, over [first t, end]."""
    pts = [(t, v) for t, v in points if t <= end]
    if len(pts) < 2:
        return float(pts[0][1]) if pts else 0.0
    area = sum(v * (t1 - t0) for (t0, v), (t1, _) in zip(pts, pts[1:], strict=False))
    area += pts[-1][1] * max(end - pts[-1][0], 0.0)
    return area / max(end - pts[0][0], 1e-9)


def measured(records: list[dict]) -> dict:
    ok = [r for r in records if r["ok"]]
    ttft = np.array([r["ttft_s"] for r in ok])
    tpot = np.array([(r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1])
    span = max(r["sent_s"] + r["e2e_s"] for r in ok) - min(r["sent_s"] for r in ok)
    return {"ttft_p50": float(np.percentile(ttft, 50)), "ttft_p90": float(np.percentile(ttft, 90)),
            "tpot_p50": float(np.percentile(tpot, 50)), "output_tok_s": sum(r["output_tokens"] for r in ok) / span,
            "span_s": span}


def predicted(sim, res: dict) -> dict:
    span = max(r.finish_s for r in sim.done) - min(r.arrival_s for r in sim.done)
    replicas = mean_replicas([(row["t"], float(sum(row["replicas"].values()))) for row in res["timeline"]], span)
    return {"ttft_p50": res["ttft_s"]["p50"], "ttft_p90": res["ttft_s"]["p90"], "tpot_p50": res["tpot_s"]["p50"],
            "output_tok_s": res["output_tokens"] / span, "span_s": span, "replicas": replicas}


ROWS = (("ttft_p50", "TTFT p50", 1e3, "ms"), ("ttft_p90", "TTFT p90", 1e3, "ms"), ("tpot_p50", "TPOT p50", 1e3, "ms"),
        ("output_tok_s", "throughput", 1, "tok/s"), ("replicas", "mean replicas", 1, "ready"))
TARGET = 0.15  # each figure within 15% of the measured one


def error(meas: dict, pred: dict, key: str) -> float:
    return (pred[key] - meas[key]) / meas[key] if meas[key] else float("nan")


def print_table(meas: dict, pred: dict, again: dict | None = None) -> list[float]:
    """Measured against predicted (and against the fleet's second serving, if any); returns the errors."""
    print(f"{'figure':<22}{'measured':>12}{'predicted':>12}{'error':>10}"
          + (f"{'again':>12}{'apart':>10}" if again else ""))
    errors = []
    for key, label, scale, unit in ROWS:
        errors.append(error(meas, pred, key))
        line = f"{label + ' (' + unit + ')':<22}{meas[key] * scale:>12.1f}{pred[key] * scale:>12.1f}"
        line += f"{errors[-1]:>+10.1%}"
        if again:
            line += f"{again[key] * scale:>12.1f}{error(meas, again, key):>+10.1%}"
        print(line)
    return errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=90.0, help="seconds of traffic per load (90)")
    ap.add_argument("--loads", default="0.3,0.6,0.9", help="shares of the 3-replica capacity (0.3,0.6,0.9)")
    ap.add_argument("--node-cores", type=float, default=float(os.cpu_count() or 2),
                    help="cores the replicas share (default: this machine's)")
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the built-in model)")
    ap.add_argument("--repeat", action="store_true",
                    help="serve each trace twice and print the fleet against itself: the noise floor no "
                         "prediction can beat on this machine")
    ap.add_argument("-o", "--output", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # every replica runs one engine thread (read by each child at start)
    import torch

    torch.set_num_threads(1)  # and the in-process profile
    from argosy.models.builtin import BUILTIN_MODEL_DIR
    from argosy.sim.traffic import TrafficSpec

    ckpt = args.model or str(BUILTIN_MODEL_DIR)
    tmp = Path(tempfile.mkdtemp(prefix="argosy-predict-"))
    fleet = fleet_file(tmp, ckpt)
    log = lambda m: print("   " + m, flush=True)  # noqa: E731
    print("1/4 profiling one replica at low load (the only input the simulator gets) ...", flush=True)
    work0 = host_work_s()
    prof = profile_once(ckpt, log)
    work_profile = (work0 + host_work_s()) / 2
    prof.save(tmp / "profile.json")
    cap = capacity(prof, fleet, args.node_cores)
    print(f"   the profile says three replicas serve {cap:.1f} req/s on {args.node_cores:g} cores", flush=True)
    loads = [(f"{float(x):.0%} load", TrafficSpec(duration_s=args.duration, rate=float(x) * cap, seed=7, **SHAPE))
             for x in args.loads.split(",")]
    loads.append(("bursty", TrafficSpec(duration_s=args.duration, rate=0.45 * cap, burstiness=0.3, seed=11,
                                        spikes=[{"at_s": args.duration / 3, "duration_s": 15, "multiplier": 2}],
                                        **SHAPE)))
    rows, replays, worst, floor, within = [], [], 0.0, 0.0, 0
    for i, (name, spec) in enumerate(loads, 1):
        from argosy.sim.traffic import make_requests

        reqs = make_requests(spec)
        sent = tmp / f"sent-{i}.jsonl"
        sent.write_text("".join(json.dumps({"timestamp": t, "prompt_tokens": p, "output_tokens": o}) + "\n"
                                for t, p, o in zip(reqs.arrival_s, reqs.prompt_tokens, reqs.output_tokens,
                                                   strict=False)))
        print(f"2/4 [{name}] {len(reqs.arrival_s)} requests over {spec.duration_s:g} s through argosy serve ...",
              flush=True)
        work_before = host_work_s()
        counts, cpu = serve_and_bench(fleet, sent, tmp / f"bench-{i}.json")
        work_after = host_work_s()
        records = json.loads((tmp / f"bench-{i}.json").read_text())["runs"][0]["records"]
        ok = [r for r in records if r["ok"]]
        replay = tmp / f"replay-{i}.jsonl"  # what was really sent, with the token counts the server gave
        replay.write_text("".join(json.dumps({"timestamp": r["sent_s"], "prompt_tokens": r["prompt_tokens"],
                                              "output_tokens": r["output_tokens"]}) + "\n" for r in ok))
        print(f"3/4 [{name}] predicting it from the profile ...", flush=True)
        rspec = TrafficSpec(duration_s=max(r["sent_s"] for r in ok) + 1, trace=str(replay))
        replays.append(rspec)
        sim, res = sim_run(prof, fleet, rspec, args.node_cores)
        meas, pred = measured(records), predicted(sim, res)
        meas["replicas"] = mean_replicas([(t, float(n)) for t, n in counts], meas["span_s"])
        sim_cpu = res["node_cpu_s"]
        node_cpu = {"measured": cpu, "predicted": {"engines": sim_cpu["engines"],
                                                   "outside": sim_cpu["outside"], "starts": sim_cpu["starts"]}}
        row = {"load": name, "requests": len(records), "ok": len(ok), "measured": meas, "predicted": pred,
               "node_cpu_s": node_cpu,
               # The fixed work's time around the load over its time at the profile: > 1, the host was slower.
               "host_slowdown": {"before": work_before / work_profile, "after": work_after / work_profile},
               "replicas_measured": counts,
               "replicas_predicted": [(r["t"], sum(r["replicas"].values())) for r in res["timeline"]]}
        if args.repeat:  # the same requests again on a fresh fleet: how far the fleet is from itself
            print(f"2/4 [{name}] the same requests again (--repeat) ...", flush=True)
            again_counts, _ = serve_and_bench(fleet, sent, tmp / f"again-{i}.json")
            again_records = json.loads((tmp / f"again-{i}.json").read_text())["runs"][0]["records"]
            again = measured(again_records)
            again["replicas"] = mean_replicas([(t, float(n)) for t, n in again_counts], again["span_s"])
            row["measured_again"] = again
        rows.append(row)
        again = row.get("measured_again")
        print(f"\n{name}: {len(ok)}/{len(records)} requests ok")
        errors = print_table(meas, pred, again)
        worst = max([worst, *map(abs, errors)])
        within += sum(abs(e) <= TARGET for e in errors)
        if again:
            floor = max([floor, *(abs(again[k] - meas[k]) / meas[k] for k, *_ in ROWS if meas[k])])
        m, p = node_cpu["measured"], node_cpu["predicted"]
        print(f"node CPU (CPU-s): engines {m['engines']:.1f} measured, {p['engines']:.1f} predicted; outside them "
              f"{m['outside']:.1f} measured, {p['outside']:.1f} predicted; replica starts {p['starts']:.1f} predicted "
              "(measured: in the two before)", flush=True)
        h = row["host_slowdown"]
        print(f"the host against itself at the profile (a fixed piece of work): x{h['before']:.2f} before this load, "
              f"x{h['after']:.2f} after it (> 1: slower)", flush=True)
        print(flush=True)
    # The same replica profiled again, after the fleet: not the prediction (that is the first profile's), but how
    # far the answer moves with the profile's minute alone, the fleet runs unchanged.
    print("4/4 profiling the replica again, after the loads (the same measurement, to see the host move) ...",
          flush=True)
    work_end0 = host_work_s()
    prof_end = profile_once(ckpt, log)
    work_end = (work_end0 + host_work_s()) / 2
    prof_end.save(tmp / "profile-after.json")
    cap_end = capacity(prof_end, fleet, args.node_cores)
    print(f"   the profile after the loads says three replicas serve {cap_end:.1f} req/s (the first: {cap:.1f}); the "
          f"host ran the fixed work x{work_end / work_profile:.2f} as slow as at the first", flush=True)
    within_end = 0
    for i, row in enumerate(rows, 1):
        sim, res = sim_run(prof_end, fleet, replays[i - 1], args.node_cores)
        pred = predicted(sim, res)
        row["predicted_from_profile_after"] = pred
        print(f"\n{row['load']}, from the profile after the loads:")
        within_end += sum(abs(e) <= TARGET for e in print_table(row["measured"], pred))
    figures = len(rows) * len(ROWS)
    print(f"\nfrom the first profile (the prediction): {within} of {figures} figures within {TARGET:.0%}, worst error "
          f"{worst:.1%}")
    print(f"from the profile after the loads: {within_end} of {figures} within {TARGET:.0%} (the host at the second "
          f"profile: x{work_end / work_profile:.2f} the first's time for the same work)")
    if args.repeat:
        print(f"the fleet against itself (the same requests served twice): worst {floor:.1%} apart")
    if args.output:
        Path(args.output).write_text(json.dumps(
            {"profile": str(tmp / "profile.json"), "capacity_rps": cap,
             "profile_after": str(tmp / "profile-after.json"), "capacity_rps_after": cap_end,
             "host_slowdown_at_profile_after": work_end / work_profile,
             "node_cores": args.node_cores, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
