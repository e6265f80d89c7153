"""Soak (issue 15): `argosy serve` with autoscaling on, 70% of its measured capacity for `--minutes`,
every process sampled every 10 s (RSS, open fds, threads; the gateway's asyncio tasks from its
`argosy_gateway_asyncio_tasks` gauge; a replica's loop runs no long-lived tasks of its own, and its
threads are sampled), every request counted (tests/load_counter.py).
Target: no growth trend (the last 10 minutes within 5% of the first 10 after warm-up), 0 lost. Open
sockets are printed beside the client's requests in flight, which they follow; the verdict is on the
other descriptors (files, pipes, event fds), where a leak would not be hidden by the traffic's swing.

  python bench/reliability/soak.py [--minutes 30] [--warmup-minutes 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ARGOSY_KEY_PEPPER", "argosy-bench-pepper-" + secrets.token_hex(8))

from tests.fleet_fixtures import Serve, ready, tiny_fleet  # noqa: E402
from tests.load_counter import Tally, one_request  # noqa: E402

BODY = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 16}


def tree(pid: int) -> list[int]:
    """pid and its descendants (the replicas and their ranks)."""
    children = defaultdict(list)
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def open_fds(pid: int) -> tuple[int, int]:
    """(sockets, other descriptors): sockets follow the connections in use, the rest should not move."""
    sockets = other = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        sockets += target.startswith("socket:")
        other += not target.startswith("socket:")
    return sockets, other


def sample_process(pid: int) -> dict[str, float] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        sockets, other = open_fds(pid)
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    f = dict(re.findall(r"^(VmRSS|Threads):\s+(\d+)", status, re.M))
    role = "replica" if " engine " in cmd else "serve" if " serve " in cmd else cmd[:40]
    return {"rss_mib": int(f.get("VmRSS", 0)) / 1024, "socket_fds": sockets, "other_fds": other,
            "threads": int(f.get("Threads", 0)), "role": role}


def asyncio_tasks(url: str, headers: dict | None = None) -> float | None:
    try:
        text = httpx.get(url + "/metrics", headers=headers, timeout=5).text
    except httpx.HTTPError:
        return None
    m = re.search(r"^argosy_gateway_asyncio_tasks\s+(\S+)", text, re.M)
    return float(m.group(1)) if m else None


async def capacity(url: str, seconds: float = 30.0, workers: int = 16) -> float:
    """Answered requests per second with `workers` clients back to back (all replicas up), half of them
    streamed as in the soak (a stream costs the gateway and the client more than one response)."""
    done, stop = 0, time.monotonic() + seconds

    async def worker(s, i):
        nonlocal done
        while time.monotonic() < stop:
            o = await one_request(s, url, {**BODY, "stream": i % 2 == 0}, {}, 60)
            done += o.kind == "answered"
    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(worker(s, i) for i in range(workers)))
    return done / seconds


async def steady(url: str, rate: float, seconds: float, tally: Tally, on_tick) -> None:
    """Open-loop arrivals at `rate`/s (half streamed) for `seconds`; on_tick(t, requests in flight) every 10 s."""
    tasks, t0, i = set(), time.monotonic(), 0
    next_tick = t0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        while time.monotonic() - t0 < seconds:
            i += 1
            body = {**BODY, "stream": i % 2 == 0}
            t = asyncio.create_task(one_request(s, url, body, {}, 120))
            t.add_done_callback(lambda t: tally.outcomes.append(t.result()))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            if time.monotonic() >= next_tick:
                await asyncio.to_thread(on_tick, time.monotonic() - t0, len(tasks))
                next_tick += 10
            await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        await asyncio.gather(*tasks)


def trend(samples: list[dict], key: str, warm_s: float, minutes: float) -> tuple[float, float]:
    window = min(600.0, (minutes * 60 - warm_s) / 2)
    first = [s[key] for s in samples if warm_s <= s["t"] < warm_s + window and s.get(key) is not None]
    last = [s[key] for s in samples if s["t"] >= minutes * 60 - window and s.get(key) is not None]
    return (statistics.mean(first) if first else float("nan"), statistics.mean(last) if last else float("nan"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--warmup-minutes", type=float, default=2.0)
    args = ap.parse_args()
    from argosy.engine.random_model import make_random_model

    ckpt = str(make_random_model(tempfile.mkdtemp(prefix="argosy-soak-"), arch="llama", init_std=0.2))
    fleet = tiny_fleet(ckpt, min_replicas=1, max_replicas=2, target=4, stable_window_s=30, scale_down_delay_s=30)
    serve = Serve(fleet)
    samples: dict[str, list[dict]] = defaultdict(list)
    try:
        serve.wait_for("a ready replica", lambda st: len(ready(st)) >= 1, timeout=180)
        print("measuring capacity (30 s, 16 clients) ...", flush=True)
        cap = asyncio.run(capacity(serve.url))
        rate = 0.7 * cap
        print(f"capacity {cap:.1f} req/s; soak at {rate:.1f} req/s for {args.minutes:g} min", flush=True)
        tally = Tally("soak")

        def tick(t: float, in_flight: int) -> None:
            st = serve.fleet()
            samples["client"].append({"t": t, "in_flight": in_flight})
            for pid in tree(serve.proc.pid):
                s = sample_process(pid)
                if s is not None:
                    samples[f"{s['role']} {pid}"].append({"t": t, **s})
            samples["gateway tasks"].append({"t": t, "tasks": asyncio_tasks(serve.url)})
            lost = tally.lost
            print(f"[{t / 60:5.1f} min] replicas {len(ready(st))}, requests {len(tally.outcomes)}, lost {lost}; "
                  + ", ".join(f"{k.split()[0]} rss {v[-1]['rss_mib']:.0f} MiB fds {v[-1]['socket_fds']} sockets"
                              f" + {v[-1]['other_fds']}" for k, v in samples.items() if v and "rss_mib" in v[-1]),
                  flush=True)
        asyncio.run(steady(serve.url, rate, args.minutes * 60, tally, tick))
    finally:
        serve.stop()
    warm = args.warmup_minutes * 60
    print(f"\nsoak, {time.strftime('%Y-%m-%d')}, {args.minutes:g} min at {rate:.1f} req/s "
          f"(70% of {cap:.1f}), load {os.getloadavg()[0]:.1f}")
    print(f"requests {len(tally.outcomes)}, answered {tally.count('answered')}, refused {tally.count('refused')}, "
          f"cut {tally.count('cut')}, lost {tally.lost}: {dict(tally.details())}")
    print("| process | measure | first window | last window | change |\n|---|---|---|---|---|")
    grew = False
    for name, ss in samples.items():
        for key in ("rss_mib", "socket_fds", "other_fds", "threads", "tasks", "in_flight"):
            if not any(key in s for s in ss):
                continue
            a, b = trend(ss, key, warm, args.minutes)
            change = (b - a) / a * 100 if a else 0.0
            # Sockets and the client's requests in flight follow the load (the target is on the rest).
            grew |= change > 5 and key not in ("socket_fds", "in_flight")
            print(f"| {name} | {key} | {a:.1f} | {b:.1f} | {change:+.1f}% |")
    return 1 if grew or tally.lost else 0


if __name__ == "__main__":
    sys.exit(main())
