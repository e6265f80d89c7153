"""A replica pod's preStop hook: wait until the engine has no request running or waiting, so a pod
being deleted finishes its streams before Kubernetes sends SIGTERM.

    python -m argosy.fleet.drain_hook --port 8000 --timeout 60

It first waits `--settle` seconds (2) for the endpoint controllers to take the pod out of the Services
(new requests stop arriving), then polls `/metrics` until vllm:num_requests_running and
vllm:num_requests_waiting are both 0 on two polls in a row, or the timeout passes. Exit 0 either way:
a hook that fails only delays the SIGTERM that follows.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request

BUSY = (b"vllm:num_requests_running", b"vllm:num_requests_waiting")


def busy_requests(metrics: bytes) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(BUSY):
            try:
                total += float(line.rsplit(None, 1)[1])
            except (ValueError, IndexError):
                continue
    return total


def drain(url: str, timeout: float, settle: float, poll: float = 0.5) -> bool:
    """True once the engine is idle (twice in a row), False if the timeout passed first."""
    time.sleep(settle)
    deadline, idle = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/metrics", timeout=2) as resp:
                idle = idle + 1 if busy_requests(resp.read()) == 0 else 0
        except OSError:
            return True  # nothing answers: nothing left to drain
        if idle >= 2:
            return True
        time.sleep(poll)
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=2.0)
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    done = drain(f"http://127.0.0.1:{a.port}", a.timeout, a.settle)
    print(f"drain_hook: {'idle' if done else 'timed out'} after {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
