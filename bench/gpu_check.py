"""Argosy on one GPU, in one run: install, the GPU tests, then a random-weight model shaped like
Llama-3.1-8B in bf16 measured against Hugging Face transformers on the same weights and workload, the
HBM roofline, and the replica's GPU telemetry. Prints one JSON document (and writes it to $OUT/ when set).

    python3 bench/gpu_check.py               # on the GPU machine, from the repository root (< 8 minutes)
    python bench/gpu_check.py --cpu-smoke    # the same steps on the CPU with a tiny model (< 2 minutes)

On the lent H200 (docs/gpu.md has the one `run` command): its Python 3.12 has PyTorch (CUDA), Triton,
transformers, nvidia-ml-py, psutil, pytest and most of Argosy's dependencies, and reaches no registry.
The rest travels in .whl/ beside the code; fetch it here, from the repository root, once:

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \\
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \\
        pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \\
        typing-extensions==4.16.0 starlette==1.10.0 uvicorn==0.55.0 httptools==0.9.0

(3.4 MB.) The script installs those wheels and Argosy itself into /tmp/site (pip --target, no index, no
build isolation) and runs the rest of itself in a fresh interpreter with PYTHONPATH=/tmp/site.

Workload: decode at 1, 16, 64 and 256 concurrent sequences (256-token prompts, 128 new tokens each, greedy,
EOS ignored; decode tok/s = sequences x 127 / (time for 128 tokens - time for 1), the same for both, each
run on prompts of its own so that no prefix-cache hit shortens one);
prefill (32 prompts of 1024 tokens, one new token each); TTFT (one 1024-token prompt on an idle engine,
best of 3). The roofline: a decode step must read every weight but the embedding table and each
sequence's K/V once, at the device-to-device copy bandwidth measured here (bytes read + written / s).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = os.environ.get("GPU_CHECK_SITE", "/tmp/site")  # where the install goes
GPU = dict(dims="LLAMA_31_8B", dtype="bfloat16", concurrency=[1, 16, 64, 256], prompt=256, new_tokens=128,
           prefill=(32, 1024), ttft_prompt=1024, max_num_batched_tokens=8192, max_num_seqs=256)
SMOKE = dict(dims="TINY", dtype="float32", concurrency=[1, 4], prompt=32, new_tokens=12, prefill=(4, 64),
             ttft_prompt=64, max_num_batched_tokens=512, max_num_seqs=8)


def progress(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def install() -> None:
    """The carried wheels and Argosy into SITE, then this script again under that path."""
    wheels = sorted(str(p) for p in (ROOT / ".whl").glob("*.whl"))
    progress(f"installing {len(wheels)} carried wheels and Argosy into {SITE}")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
           "--no-compile", "--no-cache-dir", "--upgrade", "--target", SITE, *wheels, str(ROOT)]
    subprocess.run(cmd, check=True)
    env = {**os.environ, "PYTHONPATH": SITE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    os.execve(sys.executable, [sys.executable, __file__, "--installed", *sys.argv[1:]], env)


def run_tests(smoke: bool, out_dir: Path | None) -> dict:
    progress("running the GPU tests (tests/test_gpu.py)")
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=420)
    if out_dir is not None:
        (out_dir / "gpu_tests.log").write_text(done.stdout + done.stderr)
    summary = (done.stdout.strip().splitlines() or [""])[-1]
    progress(f"tests: {summary}")
    ok = done.returncode == 0 or (smoke and "skipped" in summary and "failed" not in summary)
    return {"passed": ok, "summary": summary, "seconds": round(time.perf_counter() - start, 1),
            "failures": [ln for ln in done.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))][:20]}


def copy_bandwidth(device) -> float:
    """Bytes read + written per second by a device-to-device copy of 1 GiB (host memory on the CPU)."""
    import torch

    n = 1 << 30 if device.type == "cuda" else 1 << 27
    src, dst = torch.empty(n, dtype=torch.uint8, device=device), torch.empty(n, dtype=torch.uint8, device=device)
    dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    sync(device)
    return 2 * n * 10 / (time.perf_counter() - start)


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    import torch
    from gpu_models import PROMPT_VOCAB

    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, PROMPT_VOCAB, (n, length), generator=g).tolist()


def timed(fn, device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def measure(generate, device, cfg: dict, side: str) -> dict:
    """generate(prompts, new_tokens) for one side: decode tok/s at each concurrency, prefill tok/s, TTFT."""
    out: dict = {"decode_tok_s": {}}
    for n in (2, 3):  # warm-up: kernels compile (both parities of the per-step array offsets), cuBLAS settles
        generate(prompts(n, 16 + n, 99), n)
    for c in cfg["concurrency"]:
        # Different prompts for the two runs: the second must not find the first's in the prefix cache.
        first = timed(lambda c=c: generate(prompts(c, cfg["prompt"], c), 1), device)
        whole = timed(lambda c=c: generate(prompts(c, cfg["prompt"], 1000 + c), cfg["new_tokens"]), device)
        out["decode_tok_s"][str(c)] = round(c * (cfg["new_tokens"] - 1) / max(whole - first, 1e-9), 1)
        progress(f"{side}: {c} sequences, {out['decode_tok_s'][str(c)]} decode tok/s")
    n, length = cfg["prefill"]
    batch = prompts(n, length, 7)
    out["prefill_tok_s"] = round(n * length / timed(lambda: generate(batch, 1), device), 1)
    out["ttft_s"] = round(min(timed(lambda i=i: generate(prompts(1, cfg["ttft_prompt"], 8 + i), 1), device)
                              for i in range(3)), 4)  # a new prompt each time: no prefix-cache hit
    progress(f"{side}: prefill {out['prefill_tok_s']} tok/s, TTFT {out['ttft_s']} s")
    return out


def transformers_side(folder: Path, tensors: dict, cfg: dict, dtype, device) -> dict:
    import torch
    from gpu_models import transformers_model

    model = transformers_model(folder, tensors, dtype, device)

    @torch.inference_mode()
    def generate(batch: list[list[int]], new_tokens: int) -> None:
        ids = torch.tensor(batch, device=device)
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)

    return {"version": __import__("transformers").__version__, **measure(generate, device, cfg, "transformers")}


def argosy_side(folder: Path, tensors: dict, cfg: dict, device, smoke: bool) -> dict:
    from gpu_models import memory_checkpoint

    from argosy import LLM, SamplingParams
    from argosy.engine.config import EngineConfig

    progress("starting Argosy's engine (weights, profiling step, CUDA graphs)")
    start = time.perf_counter()
    config = EngineConfig(model=str(folder), usage="offline", max_num_seqs=cfg["max_num_seqs"],
                          max_num_batched_tokens=cfg["max_num_batched_tokens"],
                          **({"kv_cache_memory_gib": 0.05, "dtype": "float32"} if smoke else {}))
    llm = LLM.from_config(config, checkpoint=memory_checkpoint(folder, tensors))
    runner = llm.engine.runner
    startup = time.perf_counter() - start

    def generate(batch: list[list[int]], new_tokens: int) -> None:
        llm.generate(batch, SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True), use_tqdm=False)

    result = {"startup_s": round(startup, 1), "attention_backend": runner.attention.name, "dtype": str(runner.dtype),
              "cuda_graph_sizes": sorted(runner.graphs.graphs) if runner.graphs else [],
              "kv_cache_gib": round(runner.num_blocks * runner.kv_bytes_per_block() / 2**30, 2)}
    profile = getattr(runner.platform, "last_profile", None)
    if profile is not None:
        gib = 2**30
        result["memory_profile_gib"] = {
            "total": round(profile.total / gib, 2), "in_use": round(profile.in_use / gib, 2),
            "step_peaks": [round(p / gib, 3) for p in profile.step_peaks],
            "outside_allocator": round(profile.outside_allocator / gib, 3)}
    result.update(measure(generate, device, cfg, "argosy"))
    if runner.graphs is not None:
        result["graph_replays"] = runner.graphs.replays
    return result  # the engine goes with llm: its memory is free for the replica started next


def telemetry_check(device_type: str) -> dict:
    """The replica's /metrics from a real `argosy engine` (the built-in model), and what it says of the device."""
    import re
    import urllib.request

    progress("starting a replica to read its /metrics")
    proc = subprocess.Popen([sys.executable, "-m", "argosy.server", "--port", "0", "--max-num-seqs", "8",
                             "--kv-cache-memory", "1"],
                            cwd=tempfile.gettempdir(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        deadline = time.monotonic() + 240
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
            match = re.search(r"ready, serving .* at (http://\S+)/v1", line)
            url = match.group(1) if match else None
        if url is None:
            return {"ok": False, "error": "the replica did not start", "exit": proc.poll()}
        text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    finally:
        proc.terminate()
        proc.wait(30)
    values = {}
    for line in text.splitlines():
        m = re.match(r"^(DCGM_FI_DEV_\w+|argosy_gpu_\w+|argosy_host_\w+)(\{[^}]*\})? (\S+)$", line)
        if m and m.group(1) not in values:
            values[m.group(1)] = float(m.group(3))
    need = (["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
             "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_POWER_USAGE",
             "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "argosy_gpu_throttle"] if device_type == "cuda" else [])
    need += ["argosy_host_cpu_usage_perc", "argosy_host_memory_used_bytes"]
    plausible = all(name in values for name in need)
    if device_type == "cuda" and plausible:
        plausible = (10 <= values["DCGM_FI_DEV_GPU_TEMP"] <= 110 and values["DCGM_FI_DEV_FB_USED"] > 0
                     and 0 < values["DCGM_FI_DEV_SM_CLOCK"] < 4000 and values["DCGM_FI_DEV_POWER_USAGE"] > 10)
    return {"ok": plausible, "missing": [n for n in need if n not in values], "values": values}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="the same steps on the CPU with a tiny model")
    parser.add_argument("--installed", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip-tests", action="store_true", help="measure only")
    args = parser.parse_args()
    if not args.cpu_smoke and not args.installed:
        install()  # does not return
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_models as models
    import torch

    cfg = SMOKE if args.cpu_smoke else GPU
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device here (use --cpu-smoke on a machine without one)")
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    dims, dtype = getattr(models, cfg["dims"]), getattr(torch, cfg["dtype"])
    report: dict = {"mode": "cpu-smoke" if args.cpu_smoke else "gpu", "torch": torch.__version__,
                    "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "workload": cfg}
    if not args.skip_tests:
        report["tests"] = run_tests(args.cpu_smoke, out_dir)
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = models.checkpoint_folder(Path(tmp) / "llama", dims, dtype)
        progress(f"building random weights ({cfg['dims']}, {cfg['dtype']}) on {device}")
        tensors = models.random_weights(dims, dtype, device)
        report["roofline"] = {"copy_bandwidth_gb_s": round(copy_bandwidth(device) / 1e9, 1),
                              "weight_bytes_per_step": models.weight_bytes_per_step(dims, dtype),
                              "kv_bytes_per_token": models.kv_bytes_per_token(dims, dtype)}
        for side in ("transformers", "argosy"):
            try:
                if side == "transformers":
                    report[side] = transformers_side(folder, tensors, cfg, dtype, device)
                else:
                    report[side] = argosy_side(folder, tensors, cfg, device, args.cpu_smoke)
            except torch.cuda.OutOfMemoryError as exc:
                errors.append(f"{side}: out of memory: {exc}")
            except Exception as exc:  # keep measuring the other side; the report says what failed
                errors.append(f"{side}: {type(exc).__name__}: {exc}")
                progress(errors[-1])
            gc.collect()  # a model's reference cycles would keep its GPU memory
            if device.type == "cuda":
                torch.cuda.empty_cache()
    report["telemetry"] = telemetry_check(device.type)
    report["errors"] = errors
    report["targets"] = targets(report, cfg)
    text = json.dumps(report, indent=1)
    print(text)
    if out_dir is not None:
        (out_dir / "gpu_check.json").write_text(text)


def targets(report: dict, cfg: dict) -> dict:
    """The issue's targets, each with its figure."""
    roof = report["roofline"]
    ours = report.get("argosy", {}).get("decode_tok_s", {})
    peer = report.get("transformers", {}).get("decode_tok_s", {})
    context = cfg["prompt"] + cfg["new_tokens"] / 2  # mean context over the decode
    bytes_one = roof["weight_bytes_per_step"] + context * roof["kv_bytes_per_token"]
    roofline_one = roof["copy_bandwidth_gb_s"] * 1e9 / bytes_one
    roof["single_stream_tok_s"] = round(roofline_one, 1)
    out = {"single_stream_vs_roofline": round(ours.get("1", 0) / roofline_one, 3),
           "argosy_vs_transformers_at_64": round(ours.get("64", 0) / peer["64"], 2) if peer.get("64") else None,
           "no_out_of_memory": not any("out of memory" in e for e in report["errors"]),
           "gpu_tests_pass": report.get("tests", {}).get("passed"),
           "telemetry_ok": report["telemetry"]["ok"]}
    out["met"] = (out["single_stream_vs_roofline"] >= 0.75 and (out["argosy_vs_transformers_at_64"] or 0) >= 10
                  and out["no_out_of_memory"] and bool(out["gpu_tests_pass"]) and out["telemetry_ok"]
                  and not report["errors"])
    return out


if __name__ == "__main__":
    main()
