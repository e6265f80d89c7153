"""Simulator speed: a fleet of 32 replicas at 200 req/s, in simulated seconds per wall-clock second.

Llama-3.1-8B on H100s (roofline profile), least-load routing, 512-token prompts (half of them behind
one of 8 shared 256-token prefixes) and 128-token outputs. Target: >= 12x real time.

    .venv/bin/python bench/sim_speed.py [--duration 120] [--replicas 32] [--rate 200]
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=120.0, help="simulated seconds (120)")
    ap.add_argument("--replicas", type=int, default=32)
    ap.add_argument("--rate", type=float, default=200.0, help="req/s")
    ap.add_argument("--policy", default="least_load")
    args = ap.parse_args()
    from argosy.config import ModelConfig
    from argosy.sim.fleet import FleetSim, SimSettings
    from argosy.sim.profile import model_shape, roofline_profile
    from argosy.sim.results import SLO, summarize
    from argosy.sim.traffic import TrafficSpec, make_requests

    profile = roofline_profile("H100", model_shape("llama-3.1-8b"))
    spec = TrafficSpec(duration_s=args.duration, rate=args.rate,
                       prompt_tokens={"mean": 512, "dist": "uniform", "spread": 0.5},
                       output_tokens={"mean": 128, "dist": "uniform", "spread": 0.5},
                       shared_prefix={"tokens": 256, "groups": 8, "fraction": 0.5})
    reqs = make_requests(spec)
    model = ModelConfig(name="m", routing={"policy": args.policy})
    t0 = time.perf_counter()
    sim = FleetSim(model, profile, spec, reqs, SimSettings(replicas=args.replicas))
    sim.run(lambda now, i, n: sys.stderr.write(f"\r{now:.0f}/{args.duration:g} s simulated ({i}/{n} requests)"))
    wall = time.perf_counter() - t0
    res = summarize(sim, SLO(2.0, 0.1))
    sys.stderr.write("\n")
    print(f"{args.replicas} replicas, {args.rate:g} req/s, {len(reqs)} requests, {args.duration:g} s simulated "
          f"in {wall:.1f} s wall: {args.duration / wall:.1f} sim-seconds per wall-second (target >= 12)")
    print(f"(p99 TTFT {res['ttft_s']['p99'] * 1000:.0f} ms, p99 TPOT {res['tpot_s']['p99'] * 1000:.1f} ms, "
          f"{res['requests']['completed']} completed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
