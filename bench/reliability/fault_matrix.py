"""The whole fault matrix (issue 15), one scenario after another, and its table for RELIABILITY.md.

Steady streamed and non-streamed load through real gateways (and `argosy engine` replicas on a tiny
random-weight checkpoint, `argosy serve`, a real redis-server), a fault injected, every request counted:
answered, refused (OpenAI error, Retry-After where waiting helps), cut off (SSE error event, then
[DONE]), lost (anything else). The CI test (tests/test_fault_matrix.py) runs the fast ones short.

  python bench/reliability/fault_matrix.py [--seconds 20] [--only NAME ...] [--list]
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ARGOSY_KEY_PEPPER", "argosy-bench-pepper-" + secrets.token_hex(8))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests import fault_scenarios as gateway_faults  # noqa: E402
from tests import fleet_faults, replica_faults  # noqa: E402
from tests.load_counter import HEADER  # noqa: E402


def with_pair(ckpt: str, run, *flags: str):
    pair = replica_faults.ReplicaPair(ckpt, *flags)
    try:
        return run(pair)
    finally:
        pair.stop()


def scenarios(ckpt: str, s: float) -> dict:
    return {
        "kill-mid-stream": lambda: with_pair(ckpt, lambda p: replica_faults.replica_killed(p, "mid-stream", s)),
        "kill-mid-queue": lambda: with_pair(ckpt, lambda p: replica_faults.replica_killed(p, "mid-queue", s),
                                            "--max-num-seqs", "1"),
        "kill-mid-prefill": lambda: with_pair(ckpt, lambda p: replica_faults.replica_killed(p, "mid-prefill", s),
                                              "--max-num-batched-tokens", "32"),
        "stop-cont": lambda: with_pair(ckpt, lambda p: replica_faults.replica_frozen(p, 8.0, s)),
        "upstream-silent": lambda: gateway_faults.upstream_goes_bad("silent", s),
        "upstream-garbage": lambda: gateway_faults.upstream_goes_bad("garbage", s),
        "upstream-close-headers": lambda: gateway_faults.upstream_goes_bad("close_headers", s),
        "upstream-trickle": lambda: gateway_faults.upstream_goes_bad("trickle", s),
        "upstream-stall-stream": lambda: gateway_faults.upstream_goes_bad("stall_stream", s),
        "redis-restart": lambda: gateway_faults.redis_restarted_under_two_gateways(s),
        "gateway-restart-at-zero": lambda: fleet_faults.gateway_restarted_at_zero(ckpt, max(s, 30.0)),
        "controller-killed": lambda: fleet_faults.controller_killed(ckpt, s),
        "kv-too-small": lambda: replica_faults.kv_cache_too_small(ckpt, s),
        "10x-capacity": lambda: with_pair(ckpt, lambda p: gateway_faults.ten_times_capacity(
            60.0, p.replicas[1].url, model=replica_faults.MODEL_NAME, max_in_flight=8, max_tokens=16,
            upstream_key=p.secret)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="load after each fault (s)")
    ap.add_argument("--only", nargs="*", help="run these scenarios only")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    from argosy.engine.random_model import make_random_model

    ckpt = str(make_random_model(tempfile.mkdtemp(prefix="argosy-faults-"), arch="llama", init_std=0.2))
    table = scenarios(ckpt, args.seconds)
    if args.list:
        print("\n".join(table))
        return 0
    names = args.only or list(table)
    rows, lost = [], 0
    for name in names:
        t0 = time.monotonic()
        print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
        tally = table[name]()
        lost += tally.lost
        rows.append(tally.row())
        extra = "" if tally.survivors_up else "  (A GATEWAY OR HEALTHY REPLICA DIED)"
        print(f"    {time.monotonic() - t0:.0f} s; not answered: {dict(tally.details())}{extra}", flush=True)
    print(f"\nfault matrix, {time.strftime('%Y-%m-%d')}, load {os.getloadavg()[0]:.1f} (1-min average at the end)")
    print(HEADER)
    print("\n".join(rows))
    print(f"\nlost in all: {lost}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
