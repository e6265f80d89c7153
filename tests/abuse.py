"""Abuse of the front door (issue 15): idle connections, slow-loris request heads, clients that never
read their streams, and floods of wrong keys, while a valid client measures its latency. Used by
tests/test_abuse.py (light) and bench/reliability/abuse.py (as many connections as the fd limit allows).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import secrets
import socket
import statistics
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

BODY = {"model": "m", "prompt": "hello", "max_tokens": 4}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def connection_budget(reserve: int = 600, cap: int = 10_000) -> int:
    """How many sockets this process may open for an abuse run: the fd limit less a reserve, at most cap."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(0, min(cap, soft - reserve))


async def valid_latencies(url: str, key: str | None, n: int, warmup: int = 5) -> list[float]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        for i in range(n + warmup):
            t0 = time.perf_counter()
            async with s.post(url + "/v1/completions", json=BODY, headers=headers) as r:
                await r.read()
                assert r.status == 200, r.status
            if i >= warmup:
                out.append(time.perf_counter() - t0)
            await asyncio.sleep(0.02)
    return out


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def summary(xs: list[float]) -> str:
    return f"p50 {statistics.median(xs) * 1000:.1f} ms, p99 {p99(xs) * 1000:.1f} ms"


class Abuse:
    """Open abusive connections against `url`; `closed_by_server()` counts those the server has closed."""

    def __init__(self, url: str):
        u = urlsplit(url)
        self.addr = (u.hostname, u.port)
        self.socks: list[socket.socket] = []
        self.tasks: list[asyncio.Task] = []
        self.stop_ev = asyncio.Event()
        self.flood_answers: list[int] = []

    def _connect(self) -> socket.socket | None:
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(self.addr)
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            return None
        self.socks.append(s)
        return s

    def idle(self, n: int) -> None:
        for _ in range(n):
            self._connect()

    def slow_loris(self, n: int) -> None:
        """Connections that send a request head one byte a second, for ever."""
        head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-pad: " + b"a" * 10_000

        async def drip(s: socket.socket) -> None:
            for b in head:
                if self.stop_ev.is_set():
                    return
                with contextlib.suppress(OSError):
                    s.send(bytes([b]))
                await asyncio.sleep(1.0)
        for _ in range(n):
            s = self._connect()
            if s is not None:
                self.tasks.append(asyncio.create_task(drip(s)))

    def never_read(self, n: int, key: str | None, max_tokens: int = 100_000, model: str = "m") -> None:
        """Streams asked for and never read (a small receive buffer, nothing consumed)."""
        body = json.dumps({**BODY, "model": model, "max_tokens": max_tokens, "stream": True}).encode()
        auth = f"authorization: Bearer {key}\r\n".encode() if key else b""
        req = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" + auth +
               b"content-length: %d\r\n\r\n" % len(body) + body)

        async def send_only(s: socket.socket) -> None:
            await asyncio.sleep(0.1)  # connected by now
            with contextlib.suppress(OSError):
                s.send(req)
        for _ in range(n):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(self.addr)
            self.socks.append(s)
            self.tasks.append(asyncio.create_task(send_only(s)))

    def flood_bad_keys(self, url: str, workers: int, kid: str = "00000000") -> None:
        async def worker() -> None:
            async with aiohttp.ClientSession() as s:
                while not self.stop_ev.is_set():
                    key = f"sk-argosy-{kid}-{secrets.token_urlsafe(24)}"
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                        async with s.post(url + "/v1/completions", json=BODY,
                                          headers={"authorization": f"Bearer {key}"}) as r:
                            await r.read()
                            self.flood_answers.append(r.status)
        self.tasks += [asyncio.create_task(worker()) for _ in range(workers)]

    def closed_by_server(self) -> int:
        closed = 0
        for s in self.socks:
            try:
                data = s.recv(1 << 16, socket.MSG_PEEK)
                closed += data == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        return closed

    async def close(self) -> None:
        self.stop_ev.set()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for s in self.socks:
            s.close()
        self.socks.clear()


async def _abuse_for(url: str, kind: str, n: int, seconds: float, model: str) -> None:
    a = Abuse(url)
    if kind == "idle":
        a.idle(n)
    elif kind == "slow-loris":
        a.slow_loris(n)
    elif kind == "never-read":
        a.never_read(n, None, model=model)
    elif kind == "bad-keys":
        a.flood_bad_keys(url, n)
    total = len(a.socks) or n
    print(f"ABUSING {total}", flush=True)
    await asyncio.sleep(seconds)
    closed = a.closed_by_server()
    await a.close()
    print(f"CLOSED {closed} of {total}; flood answers {dict(Counter(a.flood_answers))}", flush=True)


if __name__ == "__main__":  # python tests/abuse.py URL KIND N SECONDS [MODEL]: abusers in their own process
    import sys
    from collections import Counter

    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    asyncio.run(_abuse_for(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]),
                           sys.argv[5] if len(sys.argv) > 5 else "m"))
