"""What a router adds on top of the same fast upstream, in one run: direct, the Argosy gateway,
vllm-router, sglang-router and LiteLLM's proxy.

For each: latency at a fixed open-loop rate (default 200 req/s), then the highest rate it sustains
(closed loop, `--concurrency` clients, successful req/s). The latency runs take turns in `--rounds`
rounds (direct, argosy, vllm-router, sglang-router, then again), so that a shared machine's speed,
which drifts over minutes, weighs on every target alike: added p50/p99 is the median over rounds of
a target's percentile minus direct's in the same round. LiteLLM, which falls behind at this rate and
stays busy draining its queue, is measured after the others.
The upstream is tests/gateway_fixtures.py: it answers far faster than any engine, so the router is
what is measured. Peers run from their own venvs (see /work/shared/PEERS.md); a missing one is
reported as skipped. Targets: added p50 <= 1 ms, p99 <= 5 ms at 200 req/s; >= 3x LiteLLM's rate.

  python bench/gateway_overhead.py [--rate 200] [--seconds 10] [--rounds 5] [--peers-dir /tmp/peers]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.gateway_fixtures import start_gateway, start_upstream  # noqa: E402

os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0",
                  LITELLM_LOCAL_MODEL_COST_MAP="True", DO_NOT_TRACK="1")
BODY = {"model": "m", "prompt": "Say hello to the router benchmark.", "max_tokens": 8}


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Peer:
    def __init__(self, name: str, cmd: list[str], port: int, headers: dict | None = None, env: dict | None = None):
        self.name, self.url, self.headers = name, f"http://127.0.0.1:{port}", headers or {}
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".log", delete=False)
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def wait(self, timeout: float = 90) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.p.poll() is None:
            try:
                r = httpx.post(self.url + "/v1/completions", json=BODY, headers=self.headers, timeout=5)
                if r.status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        return False

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()
        os.unlink(self.log.name)


async def fixed_rate(url: str, headers: dict, rate: float, seconds: float) -> tuple[list[float], int]:
    """Open loop: requests start on schedule whatever the answers do; returns latencies and errors."""
    lat, errors = [], 0
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        async def one():
            nonlocal errors
            t = time.perf_counter()
            try:
                async with s.post(url + "/v1/completions", json=BODY, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                        return
            except aiohttp.ClientError:
                errors += 1
                return
            lat.append(time.perf_counter() - t)

        for _ in range(20):  # warm the connection pool
            await one()
        lat.clear()
        tasks, t0, n = [], time.perf_counter(), int(rate * seconds)
        for i in range(n):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    return lat, errors


async def max_rate(url: str, headers: dict, concurrency: int, seconds: float) -> float:
    ok = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        end = time.perf_counter() + seconds

        async def worker():
            nonlocal ok
            while time.perf_counter() < end:
                try:
                    async with s.post(url + "/v1/completions", json=BODY, headers=headers) as r:
                        await r.read()
                        ok += r.status == 200
                except aiohttp.ClientError:
                    pass

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return ok / (time.perf_counter() - t0)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def start_peers(args, up_url: str, tmp: Path) -> list[Peer]:
    peers = []
    d = Path(args.peers_dir)
    vr = d / "vllm-router/bin/vllm-router"
    vr = str(vr) if vr.exists() else shutil.which("vllm-router")
    if vr:
        port = free_port()
        peers.append(Peer("vllm-router", [vr, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", up_url,
                                          "--policy", "round_robin"], port))
    sg = d / "sglang-router/bin/python"
    if sg.exists():
        from argosy.engine.random_model import make_random_model

        tok = make_random_model(tmp / "tok-model", arch="llama")
        port = free_port()
        peers.append(Peer("sglang-router", [str(sg), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                                            "--port", str(port), "--worker-urls", up_url, "--policy", "round_robin",
                                            "--tokenizer-path", str(tok), "--prometheus-host", "127.0.0.1",
                                            "--prometheus-port", str(free_port())], port))
    ll = d / "litellm/bin/litellm"
    if ll.exists():
        cfg = tmp / "litellm.yaml"
        cfg.write_text(json.dumps({
            "model_list": [{"model_name": "m", "litellm_params": {
                "model": "text-completion-openai/m", "api_base": up_url + "/v1", "api_key": "none"}}],
            "general_settings": {"master_key": "sk-bench"}}))
        port = free_port()
        peers.append(Peer("litellm", [str(ll), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port),
                                      "--num_workers", "1"], port, headers={"authorization": "Bearer sk-bench"}))
    return peers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=200)
    ap.add_argument("--seconds", type=float, default=10, help="of latency per target, over all rounds")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--peers-dir", default=os.environ.get("ARGOSY_PEERS_DIR", "/tmp/peers"))
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    up = start_upstream("fast")
    gw, peers, results = None, [], {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            gw = start_gateway({"models": [{"name": "m", "upstreams": [up.url]}]}, "--log-level", "warning")
            targets = [("direct", up.url, {}), ("argosy", gw.url, {})]
            if not args.no_peers:
                peers = start_peers(args, up.url, Path(tmp))
                for p in peers:
                    if p.wait():
                        targets.append((p.name, p.url, p.headers))
                    else:
                        print(f"{p.name}: did not start; skipped", file=sys.stderr)
            turns = [t for t in targets if t[0] != "litellm"]
            rounds = {name: [] for name, *_ in targets}
            for k in range(args.rounds):
                for name, url, hdr in turns:
                    rounds[name].append(asyncio.run(fixed_rate(url, hdr, args.rate, args.seconds / args.rounds)))
                print(f"latency round {k + 1}/{args.rounds} done", file=sys.stderr)
            for name, url, hdr in targets:
                if name == "litellm":
                    rounds[name] = [asyncio.run(fixed_rate(url, hdr, args.rate, args.seconds))]
                lat = [x for r, _ in rounds[name] for x in r]
                mx = asyncio.run(max_rate(url, hdr, args.concurrency, args.seconds / 2))
                results[name] = {"p50_ms": pct(lat, .5), "p99_ms": pct(lat, .99),
                                 "errors": sum(e for _, e in rounds[name]), "max_rps": mx,
                                 "rounds": [(pct(r, .5), pct(r, .99)) for r, _ in rounds[name]]}
                print(f"measured {name}", file=sys.stderr)
        finally:
            for p in peers:
                p.stop()
            if gw:
                gw.stop()
            up.stop()
    d = results["direct"]
    print(f"\nsame fast upstream, {args.rate:g} req/s for {args.seconds:g} s; max rate at concurrency "
          f"{args.concurrency} (2-core machine: load generator, router and upstream share it)")
    print(f"{'target':<14}{'p50 ms':>9}{'p99 ms':>9}{'added p50':>11}{'added p99':>11}{'errors':>8}{'max req/s':>11}")
    for name, r in results.items():
        if len(r["rounds"]) == len(d["rounds"]):  # paired with direct's rounds
            r["added_p50_ms"], r["added_p99_ms"] = (
                statistics.median(a[i] - b[i] for a, b in zip(r["rounds"], d["rounds"], strict=True)) for i in (0, 1))
        else:
            r["added_p50_ms"], r["added_p99_ms"] = r["p50_ms"] - d["p50_ms"], r["p99_ms"] - d["p99_ms"]
        print(f"{name:<14}{r['p50_ms']:9.2f}{r['p99_ms']:9.2f}{r['added_p50_ms']:11.2f}{r['added_p99_ms']:11.2f}"
              f"{r['errors']:8d}{r['max_rps']:11.0f}")
    a = results["argosy"]
    print(f"\nargosy added p50 {a['added_p50_ms']:.2f} ms (target <= 1), p99 {a['added_p99_ms']:.2f} ms (target <= 5)")
    if "litellm" in results:
        print(f"argosy / litellm sustained rate: {a['max_rps'] / results['litellm']['max_rps']:.1f}x (target >= 3x)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
