"""The progress line: one stderr line rewritten in place while a run goes (TTYs only)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque

WINDOW_S = 5.0  # the shown rate is over the last few seconds: a ramp's rate shows as it climbs


class Progress:
    def __init__(self, label: str, total: int | None, duration_s: float | None, enabled: bool | None = None):
        self.label, self.total, self.duration_s = label, total, duration_s
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.done = self.errors = self.in_flight = 0
        self._start = time.perf_counter()
        self._task: asyncio.Task | None = None
        self._width = 0
        self._ends: deque[float] = deque()

    def request_started(self) -> None:
        self.in_flight += 1

    def request_done(self, ok: bool) -> None:
        self.in_flight -= 1
        self.done += 1
        self.errors += not ok
        self._ends.append(time.perf_counter())

    def line(self) -> str:
        elapsed = time.perf_counter() - self._start
        parts = [f"[{self.label}]"]
        if self.total is not None:
            parts.append(f"{self.done}/{self.total} requests")
        else:
            parts.append(f"{self.done} requests")
        parts.append(f"{elapsed:.1f} s" + (f"/{self.duration_s:g} s" if self.duration_s else ""))
        while self._ends and self._ends[0] < time.perf_counter() - WINDOW_S:
            self._ends.popleft()
        window = min(WINDOW_S, elapsed)
        parts.append(f"{len(self._ends) / window if window > 0 else 0.0:.2f} req/s")
        parts.append(f"{self.in_flight} in flight")
        parts.append(f"{self.errors} errors")
        return "  ".join(parts)

    def _draw(self) -> None:
        text = self.line()
        pad = max(self._width - len(text), 0)  # blank out what a longer previous line left
        sys.stderr.write("\r" + text + " " * pad)
        sys.stderr.flush()
        self._width = len(text)

    async def _loop(self) -> None:
        while True:
            self._draw()
            await asyncio.sleep(0.25)

    def start(self) -> None:
        self._start = time.perf_counter()
        if self.enabled:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()
