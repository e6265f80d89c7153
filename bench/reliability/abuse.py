"""Abuse of the gateway (issue 15), one kind at a time, the abusers in their own process: wrong-key
floods, slow-loris request heads, as many idle connections as the fd limit allows (at most 10,000), and
clients that never read their streams. A valid client measures its latency quiet and under each; the
gateway's RSS and open descriptors are sampled. Target: p99 within 3x quiet, memory bounded.

  python bench/reliability/abuse.py [--seconds 40] [--only KIND ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.abuse import connection_budget, open_fds, p99, rss_mib, valid_latencies  # noqa: E402
from tests.gateway_fixtures import start_gateway, start_upstream  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=40.0, help="how long each abuse lasts")
    ap.add_argument("--samples", type=int, default=200, help="valid requests measured quiet and under abuse")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    kinds = {"bad-keys": 50, "slow-loris": 1000, "idle": connection_budget(), "never-read": 20}
    rows = []
    for kind, n in kinds.items():
        if args.only and kind not in args.only:
            continue
        up, big = start_upstream("valid"), start_upstream("endless", token_delay=0.002)
        big.control(text=" ".join(["x" * 2048] * 20_000))  # 2 KiB events, 500 a second, 40 MB a stream
        gw = start_gateway({"gateway": {"request_header_timeout_s": 10.0, "idle_read_timeout_s": 10.0},
                            "models": [{"name": "m", "upstreams": [up.url]}, {"name": "big", "upstreams": [big.url]}]})
        pid = gw.popen.pid
        try:
            print(f"[{time.strftime('%H:%M:%S')}] {kind} x {n} ...", flush=True)
            quiet = asyncio.run(valid_latencies(gw.url, None, args.samples))
            rss0, fds0 = rss_mib(pid), open_fds(pid)
            abuser = subprocess.Popen([sys.executable, str(ROOT / "tests/abuse.py"), gw.url, kind, str(n),
                                       str(args.seconds), "big"], stdout=subprocess.PIPE, text=True,
                                      env={**os.environ, "PYTHONPATH": str(ROOT)})
            print("   ", abuser.stdout.readline().strip(), flush=True)
            time.sleep(3)
            under = asyncio.run(valid_latencies(gw.url, None, args.samples))
            rss1, fds1 = rss_mib(pid), open_fds(pid)
            closed = abuser.stdout.read().strip()
            abuser.wait(60)
            ratio = p99(under) / p99(quiet)
            rows.append(f"| {kind} | {n} | {p99(quiet) * 1000:.1f} | {p99(under) * 1000:.1f} | {ratio:.2f} | "
                        f"{rss0:.0f} -> {rss1:.0f} | {fds0} -> {fds1} | {closed} |")
            print("   ", rows[-1], flush=True)
        finally:
            gw.stop()
            up.stop()
            big.stop()
    print(f"\nabuse, {time.strftime('%Y-%m-%d')}, load {os.getloadavg()[0]:.1f}")
    print("| abuse | abusers | quiet p99 ms | under abuse p99 ms | ratio (target <= 3) | gateway RSS MiB | "
          "gateway fds | after the abuse |\n|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
