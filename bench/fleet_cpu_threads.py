"""CPU replicas sharing one machine: the fleet's share of its cores against torch's default, same traffic.

`argosy serve` with a fleet file of the built-in model, autoscaling 1..3 replicas on concurrency (the
fleet of bench/sim_prediction.py), driven by `argosy bench` open loop (Poisson, 128-token prompts and
64-token outputs, both +-50%). Each round serves the same traffic twice on fresh fleets, in alternating
order:
- share: what the fleet now does, each CPU replica on its share of the usable cores (`--cpu-threads`,
  here max(1, cores // 3));
- all cores: `engine.cpu_threads` set to the usable cores, what torch gave every replica before.

No peer: this is the fleet against itself with one setting changed. The load starts on one replica and
the autoscaler adds two, so both configurations run one, then three replicas.

    .venv/bin/python bench/fleet_cpu_threads.py [--rate 20] [--duration 30] [--rounds 2]

Run it on a quiet machine, without OMP_NUM_THREADS set (it overrides the fleet's share).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim_prediction import AUTOSCALING, ENGINE  # noqa: E402 - the prediction bench's fleet, the same here


def fleet_file(tmp: Path, ckpt: str, threads: int | None) -> Path:
    import yaml

    engine = {**ENGINE, **({"cpu_threads": threads} if threads else {})}
    path = tmp / f"fleet-{threads or 'share'}.yaml"
    path.write_text(yaml.safe_dump({"models": [{"name": "builtin", "checkpoint": ckpt, "engine": engine,
                                                "routing": {"policy": "prefix"}, "autoscaling": AUTOSCALING}]}))
    return path


def serve_once(fleet: Path, args, out: Path) -> dict:
    from argosy.sim.measure_node import start_serve, stop_serve

    proc, url = start_serve(fleet)
    try:
        subprocess.run([sys.executable, "-m", "argosy.cli", "bench", "--url", url, "--model", "builtin",
                        "--rate", str(args.rate), "--duration", str(args.duration), "--prompt-tokens", "128",
                        "--prompt-spread", "0.5", "--output-tokens", "64", "--output-spread", "0.5",
                        "--seed", "1", "--no-progress", "-o", str(out)], check=True, stdout=subprocess.DEVNULL)
    finally:
        stop_serve(proc)
    return json.loads(out.read_text())["runs"][0]


def figures(run: dict) -> dict:
    s = run["summary"]
    return {"req_s": s["request_throughput_rps"], "ttft_p50": s["ttft_ms"]["p50"], "ttft_p90": s["ttft_ms"]["p90"],
            "tpot_p50": s["tpot_ms"]["p50"], "failed": s["failed"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=20.0, help="requests/s, open loop (20)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per serving (30)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of both configurations (2)")
    ap.add_argument("-o", "--output", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    if "OMP_NUM_THREADS" in os.environ:
        raise SystemExit("fleet_cpu_threads: unset OMP_NUM_THREADS (it would set every replica's threads)")
    from argosy.engine.host_cores import usable_cores
    from argosy.models.builtin import BUILTIN_MODEL_DIR

    cores = usable_cores()
    tmp = Path(tempfile.mkdtemp(prefix="argosy-threads-"))
    configs = {"share": fleet_file(tmp, str(BUILTIN_MODEL_DIR), None),
               "all cores": fleet_file(tmp, str(BUILTIN_MODEL_DIR), cores)}
    print(f"{cores} usable cores; share: {max(1, cores // AUTOSCALING['max_replicas'])} thread(s) a replica, "
          f"all cores: {cores}; {args.rate:g} req/s for {args.duration:g} s, {args.rounds} round(s)", flush=True)
    results: dict[str, list[dict]] = {name: [] for name in configs}
    for i in range(args.rounds):
        order = list(configs) if i % 2 == 0 else list(reversed(configs))
        for name in order:
            print(f"round {i + 1}/{args.rounds}: {name} ...", flush=True)
            f = figures(serve_once(configs[name], args, tmp / f"{name.replace(' ', '-')}-{i}.json"))
            results[name].append(f)
            print(f"   {f['req_s']:.1f} req/s, TTFT p50 {f['ttft_p50']:.1f} ms, p90 {f['ttft_p90']:.1f} ms, "
                  f"TPOT p50 {f['tpot_p50']:.2f} ms, {f['failed']} failed", flush=True)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in results.items()}
    print(f"\n{'median of rounds':22s}{'share':>12s}{'all cores':>12s}{'all / share':>13s}")
    for key, label in (("req_s", "throughput (req/s)"), ("ttft_p50", "TTFT p50 (ms)"), ("ttft_p90", "TTFT p90 (ms)"),
                       ("tpot_p50", "TPOT p50 (ms)")):
        a, b = med["share"][key], med["all cores"][key]
        print(f"{label:22s}{a:12.1f}{b:12.1f}{b / a:12.2f}x")
    if args.output:
        Path(args.output).write_text(json.dumps({"args": vars(args), "cores": cores, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
