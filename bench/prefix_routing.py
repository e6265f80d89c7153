"""Cache-aware routing against round robin and least load: 4 replicas, a multi-tenant workload in
which each tenant's requests share a long system prompt.

Per policy: the replicas' prefix-cache hit rate (against the ideal: every request after a tenant's
first finds its system prompt cached) and TTFT p50/p99 seen by clients through the gateway. Each
policy gets its own tenants (salted prompts), so no run inherits another's cache.

Replicas: `--replicas sim` (default) runs tests/gateway_fixtures.py upstreams that model a bounded
prefix cache and a prefill cost per uncached character, one prefill at a time; `--replicas argosy`
runs real Argosy replicas of the small (15.7M-parameter) random-weight model, each with a KV cache of
--replica-kv-gib (hit rate from vllm:prefix_cache_*).
Targets: hit rate >= 90% of the ideal, TTFT p50 at least 2x better than round robin.

  python bench/prefix_routing.py [--replicas sim|argosy] [--requests 240] [--rate 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.gateway_fixtures import start_gateway, start_upstream  # noqa: E402

BLOCK = 64


def workload(salt: str, tenants: int, n: int, sys_chars: int, seed: int) -> list[tuple[int, str]]:
    rnd = random.Random(seed)
    words = "policy account order refund shipping invoice warranty contact billing support".split()
    systems = [f"[{salt}] You are the assistant of tenant {t}. " +
               " ".join(rnd.choice(words) for _ in range(sys_chars // 7)) for t in range(tenants)]
    systems = [s[:sys_chars] for s in systems]
    return [(t, systems[t] + f"\nUser {i}: question about {rnd.choice(words)} {rnd.random():.6f}?")
            for i, t in enumerate(rnd.choices(range(tenants), k=n))]


def ideal_hit_rate(reqs: list[tuple[int, str]], sys_chars: int) -> float:
    seen, hit, total = set(), 0, 0
    for t, p in reqs:
        total += len(p)
        if t in seen:
            hit += sys_chars - sys_chars % BLOCK
        seen.add(t)
    return hit / total


async def run(url: str, model: str, reqs: list[tuple[int, str]], rate: float, max_tokens: int) -> list[float]:
    ttfts: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def one(prompt: str) -> None:
            t0 = time.perf_counter()
            async with s.post(url + "/v1/completions", json={"model": model, "prompt": prompt, "stream": True,
                                                              "max_tokens": max_tokens, "temperature": 0}) as r:
                first = None
                async for _ in r.content.iter_any():
                    if first is None:
                        first = time.perf_counter() - t0
                if r.status == 200 and first is not None:
                    ttfts.append(first)

        rnd, tasks, t = random.Random(1), [], time.perf_counter()
        for _, prompt in reqs:  # Poisson arrivals
            t += rnd.expovariate(rate)
            await asyncio.sleep(max(0.0, t - time.perf_counter()))
            tasks.append(asyncio.create_task(one(prompt)))
        await asyncio.gather(*tasks)
    return ttfts


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


class Replicas:
    def __init__(self, kind: str, n: int, args):
        self.kind, self.procs = kind, []
        if kind == "sim":
            for i in range(n):
                self.procs.append(start_upstream(f"r{i}", prefill_per_char=args.prefill_per_char, token_delay=0.005,
                                                 tokens=args.max_tokens, cache_blocks=args.cache_blocks))
            self.model = "m"
        else:
            sys.path.insert(0, str(ROOT / "bench"))
            from common import checkpoint

            from tests.server_fixtures import MODEL_NAME, ServerProcess

            # The 15.7M-parameter model, and a KV cache per replica that holds a few tenants' system
            # prompts but not all of them: the case where routing decides the hit rate.
            path = checkpoint("small")
            for _ in range(n):
                self.procs.append(ServerProcess(path, "--kv-cache-memory", str(args.replica_kv_gib)))
            self.model = MODEL_NAME
        self.urls = [p.url for p in self.procs]

    def counters(self) -> tuple[float, float]:
        """(cached, queried) so far, summed over replicas: characters (sim) or tokens (argosy)."""
        hit = total = 0.0
        for p in self.procs:
            if self.kind == "sim":
                s = p.stats()
                hit, total = hit + s["cached_chars"], total + s["prompt_chars"]
            else:
                from tests.server_fixtures import metric

                m = p.metrics()
                hit += metric(m, "vllm:prefix_cache_hits_total")
                total += metric(m, "vllm:prefix_cache_queries_total")
        return hit, total

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", choices=["sim", "argosy"], default="sim")
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--rate", type=float, default=20.0, help="arrivals per second (Poisson)")
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--system-chars", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--prefill-per-char", type=float, default=2e-5, help="sim: seconds per uncached character")
    ap.add_argument("--cache-blocks", type=int, default=160, help="sim: blocks a replica's prefix cache holds")
    ap.add_argument("--replica-kv-gib", type=float, default=0.03, help="argosy: KV cache per replica (GiB)")
    ap.add_argument("--json")
    args = ap.parse_args()
    reps = Replicas(args.replicas, 4, args)
    results = {}
    try:
        for policy in ("prefix", "round_robin", "least_load"):
            # one gateway per policy, its model named as the replicas serve it (bodies pass through as is)
            model = {"name": reps.model, "upstreams": reps.urls, "routing": {"policy": policy}}
            gw = start_gateway({"models": [model]}, "--log-level", "warning")
            try:
                reqs = workload(policy, args.tenants, args.requests, args.system_chars, seed=7)
                h0, q0 = reps.counters()
                ttfts = asyncio.run(run(gw.url, reps.model, reqs, args.rate, args.max_tokens))
                h1, q1 = reps.counters()
            finally:
                gw.stop()
            hit = (h1 - h0) / max(1.0, q1 - q0)
            ideal = ideal_hit_rate(reqs, args.system_chars)
            results[policy] = {"hit_rate": hit, "ideal": ideal, "of_ideal": hit / ideal, "ttft_p50_ms": pct(ttfts, .5),
                               "ttft_p99_ms": pct(ttfts, .99), "answered": len(ttfts)}
            print(f"measured {policy}", file=sys.stderr)
    finally:
        reps.stop()
    print(f"\n{args.requests} requests, {args.tenants} tenants sharing {args.system_chars}-char system prompts, "
          f"{args.rate:g} req/s Poisson, 4 {args.replicas} replicas")
    print(f"{'policy':<13}{'hit rate':>9}{'ideal':>8}{'of ideal':>10}{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}")
    for p, r in results.items():
        print(f"{p:<13}{r['hit_rate']:9.1%}{r['ideal']:8.1%}{r['of_ideal']:10.1%}{r['ttft_p50_ms']:13.1f}"
              f"{r['ttft_p99_ms']:13.1f}")
    px, rr = results["prefix"], results["round_robin"]
    print(f"\nprefix: {px['of_ideal']:.0%} of the ideal hit rate (target >= 90%); TTFT p50 "
          f"{rr['ttft_p50_ms'] / px['ttft_p50_ms']:.1f}x better than round robin (target >= 2x)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
