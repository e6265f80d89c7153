"""Tensor / pipeline parallel scaling: throughput, per-step latency and communication time per step.

    .venv/bin/python bench/parallel_scaling.py [--size small] [--configs 1x1,2x1,1x2:serial,1x2]
        [--device cuda] [--model PATH] [--backend mp|ray]

Each configuration (TPxPP) serves the same seeded workload through LLMEngine.step(), twice: first
untimed (throughput, step latency), then with every rank timing its all-reduce / gather / send /
recv (on CUDA that synchronizes around each op, hence the separate pass). Prefix caching is off so
both passes do the same work. A pipeline-parallel engine keeps P micro-batches in flight; `:serial`
runs it with one (what it did before), so the two rows show what the overlap buys. recv on a later
stage (and on the driver, waiting for the last stage's logits) includes waiting for other stages'
compute: with one batch in flight that wait is the pipeline bubble.
On a multi-GPU host: --device cuda (one GPU per rank), --model a real checkpoint, --backend ray to
place the ranks with a Ray placement group.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import checkpoint, progress, workload  # noqa: E402

from argosy import SamplingParams  # noqa: E402
from argosy.engine.checkpoint import safetensors_files  # noqa: E402
from argosy.engine.config import EngineConfig  # noqa: E402
from argosy.engine.llm_engine import LLMEngine  # noqa: E402


def run_pass(engine: LLMEngine, work, tag: str) -> tuple[float, list[float], int]:
    for i, (prompt, out_len) in enumerate(work):
        engine.add_request(f"{tag}-{i}", prompt, SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True))
    steps, tokens = [], 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        for out in engine.step():
            if out.finished:
                tokens += len(out.outputs[0].token_ids)
        steps.append(time.perf_counter() - t)
    return time.perf_counter() - start, steps, tokens


def param_count(path: str) -> int:
    from safetensors import safe_open

    total = 0
    for f in safetensors_files(path):  # sharded checkpoints too
        with safe_open(str(f), "pt") as st:
            total += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
    return total


def measure(path: str, tp: int, pp: int, serial: bool, args, work) -> dict:
    if args.device == "cpu":  # the driver is a rank too: by default it gets the workers' share of the cores
        torch.set_num_threads(args.driver_threads or max(1, (os.cpu_count() or 1) // (tp * pp)))
    backend = args.backend if tp * pp > 1 else None
    config = EngineConfig(model=path, device=args.device, kv_cache_memory_gib=args.kv_gib,
                          enable_prefix_caching=False, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                          distributed_executor_backend=backend)
    engine = LLMEngine(config)
    if serial:
        engine.pipeline_depth = 1  # one batch at a time through the stages
    try:
        run_pass(engine, work[:4], "warm")
        seconds, steps, tokens = run_pass(engine, work, "a")
        threads = f" ({torch.get_num_threads()} driver thread(s))" if args.device == "cpu" else ""
        in_flight = f", {engine.pipeline_depth} micro-batch(es) in flight" if pp > 1 else ""
        row = {"config": f"TP={tp} PP={pp}{in_flight}{threads}", "tok_s": tokens / seconds,
               "step_ms": 1e3 * statistics.mean(steps), "step_p50_ms": 1e3 * statistics.median(steps),
               "comm": {}, "comm_max_ms": 0.0}
        runner = engine.runner
        if tp * pp > 1:
            runner.stats(reset_comm=True)
            runner.set_comm_timing(True)
            _, timed_steps, _ = run_pass(engine, work, "b")
            stats = runner.stats()
            n = len(timed_steps)
            row["comm"] = {k: 1e3 * v / n for k, v in stats[0]["comm_seconds"].items()}
            row["comm_max_ms"] = max(1e3 * sum(s["comm_seconds"].values()) / n for s in stats)
            row["weights_mib"] = [round(s["param_bytes"] / 2**20, 1) for s in stats]
        return row
    finally:
        engine.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="small", choices=["tiny", "small", "125m"])
    p.add_argument("--configs", default="1x1,2x1,1x2:serial,1x2",
                   help="comma-separated TPxPP; PP>1 keeps PP micro-batches in flight, TPxPP:serial one")
    p.add_argument("--device", default="cpu", help="cpu or cuda (one GPU per rank)")
    p.add_argument("--model", default=None, help="a checkpoint folder instead of the random --size one")
    p.add_argument("--backend", default="mp", choices=["mp", "ray"],
                   help="how the ranks start: local processes, or a Ray placement group (ray.init() or RAY_ADDRESS)")
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--prompt-len", type=int, nargs=2, default=(32, 96))
    p.add_argument("--output-len", type=int, nargs=2, default=(32, 32))
    p.add_argument("--driver-threads", type=int, default=None,
                   help="CPU: torch threads of the driver (default: cores / ranks, as each worker gets)")
    p.add_argument("--kv-gib", type=float, default=0.25, help="KV cache per rank")
    args = p.parse_args()
    path = args.model or checkpoint(args.size)
    # Prompt ids from the trained tokenizer's ids; the LM head stays 8192 wide (as engine_throughput.py).
    work = workload(args.num_requests, tuple(args.prompt_len), tuple(args.output_len), vocab=900)
    cores = os.cpu_count() or 1
    name = args.model or f"{args.size} llama"
    print(f"{name} ({param_count(path) / 1e6:.1f}M parameters), {args.num_requests} requests, "
          f"prompts {args.prompt_len[0]}-{args.prompt_len[1]}, outputs {args.output_len[0]}-{args.output_len[1]} "
          f"tokens, device {args.device}")
    rows = []
    for spec in args.configs.split(","):
        shape, _, mode = spec.lower().partition(":")
        tp, pp = (int(x) for x in shape.split("x"))
        progress(f"measuring TP={tp} PP={pp}{' (serial)' if mode == 'serial' else ''}: start, warm-up, 2 passes of "
                 f"{args.num_requests} requests ...")
        rows.append(measure(path, tp, pp, mode == "serial", args, work))
        progress("\r" + " " * 100 + "\r")
        r = rows[-1]
        comm = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["comm"].items())) or "none"
        print(f"{r['config']}: {r['tok_s']:8.1f} output tok/s | step mean {r['step_ms']:6.1f} ms, "
              f"p50 {r['step_p50_ms']:6.1f} ms | comm per step, rank 0: {comm} ms; slowest rank "
              f"{r['comm_max_ms']:.2f} ms" + (f" | weights per rank {r['weights_mib']} MiB" if "weights_mib" in r
                                              else ""), flush=True)
    base = rows[0]["tok_s"]
    print("throughput vs the first config: " + ", ".join(f"{r['config']} x{r['tok_s'] / base:.2f}" for r in rows))
    if args.device == "cpu":
        print(f"note: this machine has {cores} CPU core(s), shared by all ranks (and Gloo's TCP loopback); "
              "N ranks here split the same cores, so no speed-up can show; these figures measure the "
              "parallel machinery's overhead, not its scaling. Run with --device cuda on a multi-GPU host. "
              "On a busy machine, multi-threaded torch suffers most: compare with --driver-threads 1 too.")


if __name__ == "__main__":  # the spawned ranks import this module: keep the work under the guard
    main()
