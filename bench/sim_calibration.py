"""Calibration: the simulator against a real replica, on the same workload.

1. profile the real engine on the built-in model, and what a served replica adds to it
   (`argosy profile --model`: engine steps, then bursts and lone requests against a real replica),
2. start a real `argosy engine` replica and drive it with `argosy bench` (fixed Poisson workload),
   then measure what serving adds once more: this shared machine's speed drifts by tens of percent
   over minutes, so the profile takes the mean of the measurements before and after the run,
3. replay the requests the bench sent (its send times and the server's token counts) in `argosy sim`
   with one replica and the measured profile,
4. print measured vs simulated TTFT p50/p90, TPOT p50 and output throughput, with % differences
   (target: within 15%).

    .venv/bin/python bench/sim_calibration.py [--rate 4] [--num-requests 200] [--model PATH | --size small]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import checkpoint  # noqa: E402

ENGINE_FLAGS = ["--device", "cpu", "--max-num-seqs", "32", "--max-num-batched-tokens", "512",
                "--kv-cache-memory", "0.5"]


def measured_figures(records: list[dict]) -> dict:
    ok = [r for r in records if r["ok"]]
    ttft = np.array([r["ttft_s"] for r in ok])
    tpot = np.array([(r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1])
    span = max(r["sent_s"] + r["e2e_s"] for r in ok) - min(r["sent_s"] for r in ok)
    return {"ttft_p50": np.percentile(ttft, 50), "ttft_p90": np.percentile(ttft, 90),
            "tpot_p50": np.percentile(tpot, 50), "output_tok_s": sum(r["output_tokens"] for r in ok) / span}


def simulated_figures(res: dict, sim) -> dict:
    span = max(r.finish_s for r in sim.done) - min(r.arrival_s for r in sim.done)
    return {"ttft_p50": res["ttft_s"]["p50"], "ttft_p90": res["ttft_s"]["p90"], "tpot_p50": res["tpot_s"]["p50"],
            "output_tok_s": res["output_tokens"] / span}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=4.0, help="req/s, Poisson (default 4)")
    ap.add_argument("--num-requests", type=int, default=200)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--model", default=None,
                    help="checkpoint folder (default: the built-in model); or --size for a random one")
    ap.add_argument("--size", default=None, help="a random checkpoint of this preset (tiny, small, 125m)")
    ap.add_argument("--threads", type=int, default=1,
                    help="engine threads (default 1: the load generator has the other core, so that it does not "
                         "preempt the engine's threads mid-step, which makes step times erratic on 2 cores)")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # read by every replica started below
    import torch

    torch.set_num_threads(args.threads)  # and by the in-process engine profile
    from argosy.config import ModelConfig

    # The built-in model by default: trained, so its greedy tokens are English text and every token
    # reaches the client in its own chunk. A random model samples byte tokens that are parts of UTF-8
    # characters; the server holds those back until the character is whole, so the client's first
    # chunk (its TTFT) can come several tokens after the engine's first token.
    from argosy.models.builtin import BUILTIN_MODEL_DIR
    from argosy.sim.fleet import FleetSim, SimSettings
    from argosy.sim.measure import measure_profile
    from argosy.sim.measure_serving import average_serving, free_port, measure_serving, wait_ready
    from argosy.sim.results import SLO, summarize
    from argosy.sim.traffic import TrafficSpec, make_requests

    ckpt = args.model or (checkpoint(args.size, vocab_size=512) if args.size else str(BUILTIN_MODEL_DIR))
    print("1/3 profiling the engine on this CPU ...", flush=True)
    indented = lambda m: print("   " + m, flush=True)  # noqa: E731
    engine_profile = measure_profile(ckpt, max_num_seqs=32, token_budget=512, kv_cache_memory_gib=0.5, log=indented)

    def serving():
        return measure_serving(ckpt, engine_profile, max_num_seqs=32, token_budget=512, kv_cache_memory_gib=0.5,
                               log=indented)

    before = serving()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="argosy-calib-"))
    print(f"2/3 argosy bench against a real replica: {args.num_requests} requests at {args.rate} req/s ...",
          flush=True)
    proc = subprocess.Popen([sys.executable, "-m", "argosy.cli", "engine", "--model", ckpt, "--port", str(port),
                             *ENGINE_FLAGS], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc)
        subprocess.run([sys.executable, "-m", "argosy.cli", "bench", "--url", url, "--rate", str(args.rate),
                        "--num-requests", str(args.num_requests), "--prompt-tokens", str(args.prompt_tokens),
                        "--output-tokens", str(args.output_tokens), "--seed", "1", "-o", str(tmp / "bench.json")],
                       check=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print("   what serving adds, again after the run ...", flush=True)
    after = serving()
    profile = average_serving(before, after)
    profile.save(tmp / "profile.json")
    records = json.loads((tmp / "bench.json").read_text())["runs"][0]["records"]
    ok = [r for r in records if r["ok"]]
    # The sim replays what the bench sent: its send times, and the token counts the server reported.
    trace = tmp / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": r["sent_s"], "prompt_tokens": r["prompt_tokens"],
                                         "output_tokens": r["output_tokens"]}) + "\n" for r in ok))
    print("3/3 simulating the same requests ...", flush=True)
    spec = TrafficSpec(duration_s=max(r["sent_s"] for r in ok) + 1, trace=str(trace))
    model = ModelConfig(name="m", engine={"max_num_seqs": 32, "max_num_batched_tokens": 512})
    def simulate(prof):
        sim = FleetSim(model, prof, spec, make_requests(spec), SimSettings(replicas=1))
        sim.run()
        return simulated_figures(summarize(sim, SLO()), sim)

    meas, simu = measured_figures(records), simulate(profile)
    ends = {"before": simulate(before), "after": simulate(after)}
    print(f"\n{'figure':<22}{'measured':>12}{'simulated':>12}{'difference':>12}")
    worst = 0.0
    for key, label, scale, unit in (("ttft_p50", "TTFT p50", 1e3, "ms"), ("ttft_p90", "TTFT p90", 1e3, "ms"),
                                    ("tpot_p50", "TPOT p50", 1e3, "ms"), ("output_tok_s", "throughput", 1, "tok/s")):
        diff = (simu[key] - meas[key]) / meas[key]
        worst = max(worst, abs(diff))
        name = f"{label} ({unit})"
        print(f"{name:<22}{meas[key] * scale:>12.1f}{simu[key] * scale:>12.1f}{diff * 100:>+11.1f}%")
    drift = ", ".join(f"{k} {(v['tpot_p50'] / meas['tpot_p50'] - 1) * 100:+.1f}%" for k, v in ends.items())
    print(f"\nTPOT p50 from the serving measurement before and after the run alone: {drift}")
    print(f"worst difference {worst * 100:.1f}% (target: within 15%); {len(ok)}/{len(records)} requests ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
