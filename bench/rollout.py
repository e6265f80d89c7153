"""A canary rollout under steady load through `argosy serve`: what users notice of it.

Closed-loop clients stream completions the whole time: `--warmup` seconds (not counted), `--before`
seconds on the stable revision, then `argosy rollout start` of a canary (steps 10% and 50%, analysis
every `--interval` seconds on the error-rate and TTFT-p95 gates), until it is promoted and the old
revision drained, then `--after` seconds on the new stable. Reports requests served and failed (each
request counts: an error status, a refused connection, a stream without its finish), TTFT p50/p99
before, during and after, the ratio of the during/after p99 to the before p99 (the rollout's cost to
users, measured in the same run), and the time from `rollout start` to the promotion. `--slow` makes
the candidate honestly slower (one sequence at a time) and reports instead the time until the TTFT
gate rolled it back.

    python bench/rollout.py [--model CKPT] [--clients 4] [--warmup 5] [--before 20] [--after 20] [--interval 10]
                            [--slow]
Without --model it uses the built-in model for both revisions (v2: another engine setting). Progress
is printed every second; `argosy serve` and its replicas run at a lower CPU priority (--server-nice) so
the clients are not starved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
DONE = ("succeeded", "aborted", "switched_back")


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 4)


async def client(c: httpx.AsyncClient, url: str, phase: list[str], stop: asyncio.Event, out: list, i: int,
                 max_tokens: int) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        body = {"model": "m", "prompt": f"Client {i}, request {n}: once upon a time", "max_tokens": max_tokens,
                "stream": True, "ignore_eos": True, "temperature": 0}
        t0, ttft, ok, rev, err = time.monotonic(), None, False, "?", ""
        name = phase[0]
        try:
            async with c.stream("POST", url + "/v1/completions", json=body) as r:
                rev = r.headers.get("x-argosy-revision", "?")
                async for chunk in r.aiter_bytes():
                    if ttft is None and chunk.startswith(b"data: {"):
                        ttft = time.monotonic() - t0
                    if b'"finish_reason":"length"' in chunk or b'"finish_reason": "length"' in chunk:
                        ok = r.status_code == 200
                    if b'"error"' in chunk:
                        ok, err = False, chunk[:200].decode(errors="replace")
                if r.status_code != 200:
                    err = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            err = f"{type(e).__name__}: {e}"
        out.append({"phase": name, "t": t0, "ok": ok, "ttft": ttft, "revision": rev, "error": err or None})


async def run(url: str, args: argparse.Namespace) -> dict:
    out: list[dict] = []
    phase, stop = ["warmup"], asyncio.Event()
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=100)) as c:
        tasks = [asyncio.create_task(client(c, url, phase, stop, out, i, args.max_tokens)) for i in range(args.clients)]

        async def report(label: str) -> dict:
            st = (await c.get(url + "/admin/rollouts/m")).json()
            r = st["rollout"] or {}
            done = sum(1 for o in out if o["phase"] == phase[0])
            print(f"  [{label}] split {st['split']}, rollout {r.get('phase', '-')} weight {r.get('weight', '-')} "
                  f"analyses {r.get('analyses', '-')}; {done} requests this phase, "
                  f"{sum(1 for o in out if not o['ok'])} failed", flush=True)
            return st

        t0 = time.monotonic()
        while time.monotonic() - t0 < args.warmup:  # the replica's first requests (caches, first calls): not counted
            await asyncio.sleep(1)
            await report(f"warm-up {time.monotonic() - t0:5.1f}/{args.warmup:g} s")
        phase[0] = "before"
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.before:
            await asyncio.sleep(1)
            await report(f"before {time.monotonic() - t0:5.1f}/{args.before:g} s")
        phase[0] = "during"
        started = time.monotonic()
        r = await c.post(url + "/admin/rollouts/m/start", json={"to": "v2", "strategy": "canary"})
        assert r.status_code == 200, r.text
        marks: dict[str, float] = {}  # seconds from `rollout start` (polled each second)
        while True:
            await asyncio.sleep(1)
            st = await report(f"during {time.monotonic() - started:6.1f} s")
            if st["stable"] == "v2":
                marks.setdefault("promoted", round(time.monotonic() - started, 1))
            elif st["rollout"]["reason"]:
                marks.setdefault("rolled_back", round(time.monotonic() - started, 1))
            if st["rollout"]["phase"] in DONE:
                break
            assert time.monotonic() - started < args.timeout, "the rollout did not end in time"
        ended = time.monotonic()
        phase[0] = "after"
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.after:
            await asyncio.sleep(1)
            await report(f"after {time.monotonic() - t0:5.1f}/{args.after:g} s")
        stop.set()
        await asyncio.gather(*tasks)
    ro = st["rollout"]
    res = {"outcome": ro["phase"], "reason": ro["reason"], "analyses": ro["analyses"],
           "start_to_promotion_s": marks.get("promoted"), "start_to_rollback_s": marks.get("rolled_back"),
           "rollout_start_to_end_s": round(ended - started, 1),
           "requests_served": sum(1 for o in out if o["ok"]), "requests_failed": sum(1 for o in out if not o["ok"]),
           "warmup_requests": sum(1 for o in out if o["phase"] == "warmup"),
           "failures": [o["error"] for o in out if not o["ok"]][:5]}
    for name in ("before", "during", "after"):
        rs = [o for o in out if o["phase"] == name]
        ttfts = [o["ttft"] for o in rs if o["ok"] and o["ttft"] is not None]
        by_rev: dict[str, int] = {}
        for o in rs:
            by_rev[o["revision"]] = by_rev.get(o["revision"], 0) + 1
        res[name] = {"requests": len(rs), "failed": sum(1 for o in rs if not o["ok"]), "by_revision": by_rev,
                     "ttft_p50_s": pct(ttfts, 0.5), "ttft_p99_s": pct(ttfts, 0.99)}
    base = res["before"]["ttft_p99_s"]
    for name in ("during", "after"):
        p99 = res[name]["ttft_p99_s"]
        res[name]["ttft_p99_vs_before"] = round(p99 / base, 2) if p99 and base else None
    return res


def fleet(model: str, args: argparse.Namespace) -> dict:
    v2 = {"max_num_seqs": 1} if args.slow else {"max_num_batched_tokens": 512}
    return {"gateway": {"port": 0, "health_interval_s": 1.0}, "state_file": str(Path(args.tmp) / "state.json"),
            "models": [{
                "name": "m", "checkpoint": model,
                "engine": {"kv_cache_memory_gib": 0.1, "max_num_seqs": 16},
                "admission": {"queue_timeout_s": 120},
                "autoscaling": {"min_replicas": 1, "max_replicas": 1, "tick_s": 1.0},
                "revisions": [{"name": "v1"}, {"name": "v2", "engine": v2}],
                "rollout": {"steps": [{"weight": 10, "pause_s": 2 * args.interval},
                                      {"weight": 50, "pause_s": 2 * args.interval}],
                            "analysis": {"interval_s": args.interval, "min_samples": args.min_samples,
                                         "failure_limit": 2,
                                         "gates": [{"metric": "error_rate", "max": 0.01},
                                                   {"metric": "ttft_p95", "max_ratio": args.ttft_ratio}]}}}]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint folder (default: the built-in model)")
    ap.add_argument("--clients", type=int, default=4, help="concurrent streaming clients")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--warmup", type=float, default=5, help="seconds of load first, not counted in the phases")
    ap.add_argument("--before", type=float, default=20, help="seconds of load before the rollout")
    ap.add_argument("--after", type=float, default=20, help="seconds of load after it ended")
    ap.add_argument("--interval", type=float, default=10, help="analysis interval (s); each step pauses 2 of them")
    ap.add_argument("--min-samples", type=int, default=5, help="per side and gate in a window")
    ap.add_argument("--ttft-ratio", type=float, default=2.0, help="the TTFT-p95 gate: canary <= this x stable")
    ap.add_argument("--slow", action="store_true", help="a candidate slower under load: expect a rollback")
    ap.add_argument("--timeout", type=float, default=900, help="give up on the rollout after this many seconds")
    ap.add_argument("--server-nice", type=int, default=10,
                    help="niceness added to `argosy serve` and its replicas, so the clients are not starved")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    args.tmp = tempfile.mkdtemp(prefix="bench-rollout-")
    from argosy.models.builtin import BUILTIN_MODEL_DIR

    cfg = Path(args.tmp) / "fleet.yaml"
    cfg.write_text(yaml.safe_dump(fleet(args.model or str(BUILTIN_MODEL_DIR), args)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "argosy.cli", "serve", "--config", str(cfg)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=(lambda: os.nice(args.server_nice)) if args.server_nice else None)
    log = Path(args.tmp) / "serve.log"
    f = open(log, "w")  # noqa: SIM115  (the story, JSON events, for afterwards; the pipe never fills)
    reader = None
    try:
        line = proc.stdout.readline()
        url = line.split("listening on ", 1)[1].split(";", 1)[0].strip()
        reader = threading.Thread(target=lambda: [f.write(x) for x in proc.stdout], daemon=True)
        reader.start()
        print(f"argosy serve at {url} (log: {log}); waiting for the stable replica ...", flush=True)
        t0 = time.monotonic()
        while not any(r["state"] == "ready" for r in httpx.get(url + "/admin/fleet").json()["models"][0]["replicas"]):
            assert time.monotonic() - t0 < 300, "no replica became ready"
            time.sleep(0.5)
        res = asyncio.run(run(url, args))
    finally:
        proc.terminate()
        proc.wait(60)
        if reader is not None:
            reader.join(10)
        f.close()
    res["events"] = [json.loads(x)["event"] for x in log.read_text().splitlines()
                     if '"event": "rollout_' in x and x.startswith("{")]
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    return 0 if res["requests_failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
