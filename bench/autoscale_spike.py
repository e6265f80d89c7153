"""A load step against `argosy serve`: concurrency at one replica's capacity, then 10x, then back.

Reports the time to scale (the step until the autoscaler's first new replica is ready, and until all it
asked for are), requests refused, TTFT p50/p99 before / during / after the step, cold-start times, and
the concurrency the gateway actually saw in each phase (what the autoscaler scales on).

The clients are closed loops in this one process. `argosy serve` and its replicas run at a lower CPU
priority (--server-nice) so that, on a machine whose cores the replicas fill, the load generator is not
starved: a starved client spends most of each request in its own event loop, the gateway sees a
fraction of the offered concurrency, and the autoscaler rightly scales down under what looks like 10x
load. A phase whose observed concurrency falls well short of the offered one is flagged.

    python bench/autoscale_spike.py [--model CKPT] [--target 4] [--before 10] [--during 40] [--after 10]
Without --model it builds a small random-weight checkpoint. Progress is printed every second.
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


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def client_loop(c: httpx.AsyncClient, url: str, phase: list[str], stop: asyncio.Event, out: list,
                      my_phase: str, max_tokens: int) -> None:
    body = {"model": "m", "prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    while not stop.is_set() and phase[0] == my_phase:
        t0 = time.monotonic()
        ttft, status = None, 0
        try:
            async with c.stream("POST", url + "/v1/completions", json=body) as r:
                status = r.status_code
                async for chunk in r.aiter_bytes():
                    if ttft is None and chunk.startswith(b"data: {"):
                        ttft = time.monotonic() - t0
        except httpx.HTTPError:
            status = -1
        out.append({"phase": my_phase, "t": t0, "status": status, "ttft": ttft})
        if status != 200:
            await asyncio.sleep(0.2)


async def run(url: str, args: argparse.Namespace) -> dict:
    out: list[dict] = []
    phase, stop = ["before"], asyncio.Event()
    plan = [("before", args.target, args.before), ("during", 10 * args.target, args.during),
            ("after", args.target, args.after)]
    fleet_log: list[dict] = []
    seen: dict[str, list[float]] = {}  # in flight + queued at the gateway, sampled each second
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=1000)) as c:
        step_t = None
        for name, conc, secs in plan:
            phase[0] = name
            if name == "during":
                step_t = time.monotonic()
            tasks = [asyncio.create_task(client_loop(c, url, phase, stop, out, name, args.max_tokens))
                     for _ in range(conc)]
            t0 = time.monotonic()
            while time.monotonic() - t0 < secs:
                await asyncio.sleep(1)
                st = (await c.get(url + "/admin/fleet")).json()["models"][0]
                ready = sum(1 for r in st["replicas"] if r["state"] == "ready" and not r["pooled"])
                fleet_log.append({"t": time.monotonic(), "ready": ready, "desired": st["desired"]})
                seen.setdefault(name, []).append(st["in_flight"] + st["queued"])
                done = sum(1 for o in out if o["phase"] == name)
                print(f"  [{name:>6} {time.monotonic() - t0:5.1f}/{secs} s] {conc} clients, gateway in flight "
                      f"{st['in_flight']} + queued {st['queued']}, {done} requests done, replicas ready {ready}, "
                      f"desired {st['desired']}, panic {st['panic']}", flush=True)
            phase[0] = "next"
            await asyncio.gather(*tasks)
        final = (await c.get(url + "/admin/fleet")).json()["models"][0]
    peak = max(f["desired"] or 0 for f in fleet_log if f["t"] >= step_t)
    first_up = next((f["t"] - step_t for f in fleet_log if f["t"] >= step_t and f["ready"] > 1), None)
    all_up = next((f["t"] - step_t for f in fleet_log if f["t"] >= step_t and f["ready"] >= peak), None)
    res = {"target_concurrency_per_replica": args.target, "peak_desired_replicas": peak,
           "time_to_first_new_replica_s": first_up, "time_to_all_desired_replicas_s": all_up,
           "cold_starts_s": sorted(r["cold_start_s"] for r in final["replicas"] if r["cold_start_s"])}
    for name, conc, _ in plan:
        rs = [o for o in out if o["phase"] == name]
        ttfts = [o["ttft"] for o in rs if o["ttft"] is not None and o["status"] == 200]
        obs = seen.get(name) or [0]
        res[name] = {"clients": conc, "gateway_concurrency_mean": round(sum(obs) / len(obs), 1),
                     "requests": len(rs), "refused": sum(1 for o in rs if o["status"] in (429, 503)),
                     "failed": sum(1 for o in rs if o["status"] not in (200, 429, 503)),
                     "ttft_p50_s": pct(ttfts, 0.5), "ttft_p99_s": pct(ttfts, 0.99)}
        if res[name]["gateway_concurrency_mean"] < 0.5 * conc:
            res[name]["warning"] = (f"the gateway saw {res[name]['gateway_concurrency_mean']:g} requests in flight "
                                    f"on average, not {conc}: the load generator is starved (CPU?), so the "
                                    f"autoscaler's decisions in this phase reflect that lower load")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint folder (default: a small random-weight one)")
    ap.add_argument("--target", type=int, default=4, help="concurrency one replica is sized for (requests)")
    ap.add_argument("--max-replicas", type=int, default=4)
    ap.add_argument("--before", type=float, default=10, help="seconds at 1x")
    ap.add_argument("--during", type=float, default=40, help="seconds at 10x")
    ap.add_argument("--after", type=float, default=10, help="seconds at 1x again")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--server-nice", type=int, default=10,
                    help="niceness added to `argosy serve` and its replicas, so the clients are not starved")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="autoscale-spike-")
    model = args.model
    if model is None:
        from argosy.engine.random_model import make_random_model

        model = str(make_random_model(Path(tmp) / "m", init_std=0.2))
    fleet = {"gateway": {"port": 0}, "models": [{
        "name": "m", "checkpoint": model,
        "engine": {"kv_cache_memory_gib": 0.05, "max_num_seqs": 4 * args.target},
        "admission": {"queue_timeout_s": 120},
        "autoscaling": {"min_replicas": 1, "max_replicas": args.max_replicas, "target": args.target,
                        "target_utilization": 1.0, "tick_s": 0.5, "stable_window_s": 20, "panic_window_s": 3,
                        "scale_down_delay_s": 5}}]}
    cfg = Path(tmp) / "fleet.yaml"
    cfg.write_text(yaml.safe_dump(fleet))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "argosy.cli", "serve", "--config", str(cfg), "--log-level",
                             "warning"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=(lambda: os.nice(args.server_nice)) if args.server_nice else None)
    try:
        line = proc.stdout.readline()
        url = line.split("listening on ", 1)[1].split(";", 1)[0].strip()
        # Keep reading its output (logs, a replica's failure), so a full pipe never blocks the gateway.
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
        print(f"argosy serve at {url}; waiting for the first replica ...", flush=True)
        t0 = time.monotonic()
        while not any(r["state"] == "ready" for r in httpx.get(url + "/admin/fleet").json()["models"][0]["replicas"]):
            assert time.monotonic() - t0 < 300, "no replica became ready"
            time.sleep(0.5)
        res = asyncio.run(run(url, args))
    finally:
        proc.terminate()
        proc.wait(60)
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
