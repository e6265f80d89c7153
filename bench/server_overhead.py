"""What the HTTP server costs: the same workload offline (LLM.generate) and through the server.

    .venv/bin/python bench/server_overhead.py [--size small] [--num-requests 256] [--concurrency 64]

1. Offline: every request into LLM.generate, --max-num-seqs at a time (the default equals --concurrency).
2. Server: `python -m argosy.server` with the same engine settings, --concurrency client streams
   (aiohttp, streaming /v1/completions with the prompt as token ids) each sending the next request as
   soon as its previous one ends. Output tokens/s of both, and server / offline (target >= 90%).
3. llama-cpp-python's Python server (one request at a time: not the serving peer; bench/llamacpp_server.py
   measures against llama.cpp's own continuously batching llama-server): the same HTTP workload (as
   text) at --peer-concurrency concurrent streams against argosy
   and against `python -m llama_cpp.server` from the venv named by --llamacpp-python, on the same
   weights in GGUF (converted here unless --gguf is given); skipped (saying how to set it up) when it
   is not installed. Streamed, as the issue's workload is, and then once more not streamed (each
   server's `usage` counts the tokens) for comparison. A streamed request's tokens: argosy's usage
   event; llama.cpp sends no usage, and on a random-weight model many of its tokens decode to no text,
   so with EOS suppressed a request that ends with finish_reason "length" counts its max_tokens.

Greedy, ignore_eos (llama.cpp: EOS suppressed with logit_bias), seeded lengths; only output tokens count.
The client shares the machine with the server: on a small CPU box its work shows in the server figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import Timer, checkpoint, param_count, progress, workload  # noqa: E402
from llamacpp import add_arguments, converter, peer_version, to_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_offline(path: str, work, args) -> float:
    from argosy import LLM, SamplingParams

    llm = LLM(path, kv_cache_memory_gib=args.kv_cache_gib, max_num_seqs=args.max_num_seqs)
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for _, o in work]
    llm.generate([p for p, _ in work[:4]], params[:4], use_tqdm=False)  # warm-up, as the server's
    with Timer() as t:
        outs = llm.generate([p for p, _ in work], params)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    del llm, outs
    gc.collect()
    return tokens / t.seconds


def start_server(cmd: list[str], url: str, log: Path, timeout_s: float = 600) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[2]} exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError(f"{cmd[2]} not ready after {timeout_s} s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def drive(base_url: str, items: list[dict], concurrency: int, label: str) -> float:
    """Streams every request body in `items`, `concurrency` at a time; returns output tokens/s."""
    import aiohttp

    queue: asyncio.Queue[dict] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    done, tokens = 0, 0
    start = time.perf_counter()

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done, tokens
        while not queue.empty():
            body = queue.get_nowait()
            chunks, usage, by_length = 0, None, False
            async with session.post(base_url + "/completions", json=body) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"{label}: HTTP {resp.status}: {await resp.text()}")
                if not body.get("stream"):
                    tokens += (await resp.json())["usage"]["completion_tokens"]
                    done += 1
                    continue
                async for line in resp.content:
                    # Parse only the usage event: on a small box the client's CPU time is the server's loss.
                    if line.startswith(b'data: {"id"') and b'"choices":[]' in line and b'"usage":{' in line:
                        usage = json.loads(line[6:])["usage"]["completion_tokens"]
                    elif line.startswith(b"data: {"):
                        chunks += 1
                        by_length = by_length or b'"length"' in line  # the finish_reason (text is escaped)
            if usage is None and not by_length:
                raise RuntimeError(f"{label}: a stream ended with neither usage nor finish_reason length")
            tokens += usage if usage is not None else body["max_tokens"]
            done += 1

    async def report() -> None:
        while True:
            await asyncio.sleep(0.5)
            elapsed = time.perf_counter() - start
            progress(f"{label}: {done}/{len(items)} requests, {tokens / elapsed:.1f} output tok/s   ")

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        reporter = asyncio.create_task(report())
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        reporter.cancel()
    elapsed = time.perf_counter() - start
    sys.stderr.write("\n")
    return tokens / elapsed


def http_items(work, as_text: list[str] | None, model: str, eos_bias: dict | None, stream: bool = True) -> list[dict]:
    items = []
    for i, (prompt, out_len) in enumerate(work):
        body = {"model": model, "prompt": as_text[i] if as_text else prompt, "max_tokens": out_len,
                "temperature": 0, "stream": stream}
        if eos_bias is None:
            body["ignore_eos"] = True
            if stream:
                body["stream_options"] = {"include_usage": True}
        else:  # llama.cpp: no ignore_eos; EOS suppressed instead
            body["logit_bias"] = eos_bias
        items.append(body)
    return items


def argosy_server(path: str, args, max_num_seqs: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "argosy.server", "--model", path, "--served-model-name", "bench",
           "--port", str(port), "--max-num-seqs", str(max_num_seqs), "--kv-cache-memory", str(args.kv_cache_gib),
           "--max-queue", str(args.num_requests + 1)]
    print(f"starting the argosy server (max_num_seqs {max_num_seqs}) ...", flush=True)
    proc = start_server(cmd, f"http://127.0.0.1:{port}/ready", Path(args.log_dir) / "argosy-server.log")
    return proc, f"http://127.0.0.1:{port}/v1"


def peer_comparison(path: str, work, args) -> None:
    version = peer_version(args.llamacpp_python)
    if version is None:
        print(f"llama.cpp: skipped: llama_cpp is not importable from {args.llamacpp_python}. Install it in its own "
              "venv (see bench/llamacpp.py) and pass --llamacpp-python PEER/bin/python.")
        return
    gguf = args.gguf or str(to_gguf(path, converter(args.llamacpp_src, version)))
    from argosy.engine.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(path)
    # Plain English words, which both tokenizers (ours, and the GGUF's small sentencepiece one) turn into
    # about one token each, so both servers see prompts of about the same length.
    words = "the quick brown fox jumps over the lazy dog".split()
    texts = [" ".join(words[i % len(words)] for i in range(len(p))) for p, _ in work]
    print(f"prompt tokens (of the text prompts): argosy {sum(len(tok.encode(t)) for t in texts)}", flush=True)
    eos = {str(i): -100 for i in tok.eos_token_ids}
    n = args.peer_concurrency
    proc, url = argosy_server(path, args, n)
    ours = {}
    try:
        for stream in (True, False):
            ours[stream] = asyncio.run(drive(url, http_items(work, texts, "bench", None, stream=stream), n,
                                             f"argosy server, {n} {'streams' if stream else 'requests'}"))
    finally:
        stop(proc)
    port = free_port()
    cmd = [args.llamacpp_python, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1", "--port", str(port),
           "--n_ctx", "4096", "--model_alias", "bench", "--n_threads", str(os.cpu_count()),
           # By default a waiting request interrupts the one being streamed (it ends early, without a
           # finish_reason): with concurrent streams, every request must be served in full.
           "--interrupt_requests", "False", *args.peer_args.split()]
    print("starting llama_cpp.server ...", flush=True)
    proc = start_server(cmd, f"http://127.0.0.1:{port}/v1/models", Path(args.log_dir) / "llama-cpp-server.log")
    peer = {}
    try:
        for stream in (True, False):
            peer[stream] = asyncio.run(drive(f"http://127.0.0.1:{port}/v1", http_items(work, texts, "bench", eos,
                                                                                       stream=stream),
                                             n, f"llama.cpp server, {n} {'streams' if stream else 'requests'}"))
    finally:
        stop(proc)
    print(f"\n{n} concurrent            argosy server   llama.cpp server   ratio")
    for stream, label in ((True, "streamed (target >= 5x)"), (False, "not streamed")):
        print(f"{label:<24}{ours[stream]:>10.1f} tok/s{peer[stream]:>13.1f} tok/s{ours[stream] / peer[stream]:>8.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="small", choices=["tiny", "small", "125m"])
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=None, help="engine batch limit (default: --concurrency)")
    ap.add_argument("--prompt-len", type=int, nargs=2, default=(32, 256))
    ap.add_argument("--output-len", type=int, nargs=2, default=(64, 192))
    ap.add_argument("--kv-cache-gib", type=float, default=2.0)
    ap.add_argument("--peer-concurrency", type=int, default=16)
    ap.add_argument("--gguf", default=None, help="the same checkpoint in GGUF (default: converted here)")
    add_arguments(ap)
    ap.add_argument("--peer-only", action="store_true", help="only the llama.cpp comparison")
    ap.add_argument("--peer-args", default="", help="extra llama_cpp.server flags, e.g. '--n_gpu_layers -1'")
    ap.add_argument("--log-dir", default="/tmp")
    args = ap.parse_args()
    args.max_num_seqs = args.max_num_seqs or args.concurrency
    path = checkpoint(args.size)
    work = workload(args.num_requests, tuple(args.prompt_len), tuple(args.output_len), 900, seed=0)
    print(f"checkpoint: {path} ({param_count(path) / 1e6:.1f}M parameters), {args.num_requests} requests, "
          f"prompts {args.prompt_len[0]}-{args.prompt_len[1]} tokens, outputs {args.output_len[0]}-"
          f"{args.output_len[1]} tokens, max_num_seqs {args.max_num_seqs}", flush=True)
    if args.peer_only:
        peer_comparison(path, work, args)
        return
    print("offline LLM.generate ...", flush=True)
    offline = run_offline(path, work, args)
    print(f"offline LLM.generate:            {offline:8.1f} output tok/s", flush=True)
    proc, url = argosy_server(path, args, args.max_num_seqs)
    try:
        served = asyncio.run(drive(url, http_items(work, None, "bench", None), args.concurrency,
                                   f"argosy server, {args.concurrency} streams"))
    finally:
        stop(proc)
    print(f"argosy server ({args.concurrency} streams):      {served:8.1f} output tok/s")
    print(f"server / offline: {100 * served / offline:.1f}% (target >= 90%)", flush=True)
    peer_comparison(path, work, args)


if __name__ == "__main__":
    main()
