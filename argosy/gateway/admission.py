"""Per-model admission: a bound on requests in flight and a bounded priority queue with a timeout.

Waiters are served strictly by priority class (interactive before batch), first come first served
within a class. A full queue or a timed-out wait is a 503 (capacity) with Retry-After.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from dataclasses import dataclass

from argosy.config import AdmissionConfig
from argosy.gateway.errors import unavailable

PRIORITY = {"interactive": 0, "batch": 1}


@dataclass(frozen=True)
class AdmissionLoad:
    in_flight: int  # admitted, not yet finished
    waiting: int  # queued for a slot
    tokens: int = 0  # their estimated tokens (the encoders' autoscaling signal: metric tokens)


class Admission:
    def __init__(self, cfg: AdmissionConfig):
        self.cfg = cfg
        self.in_flight = 0
        self.waiting = 0  # live waiters (the heap may also hold cancelled ones, dropped lazily)
        self.heap: list[tuple[int, int, asyncio.Future]] = []
        self.seq = itertools.count()

    def load(self) -> AdmissionLoad:
        return AdmissionLoad(self.in_flight, self.waiting)

    def try_acquire(self) -> bool:
        """A free slot taken now, with nobody queued before it: no wait (and nothing for the caller to watch)."""
        if self.in_flight < self.cfg.max_in_flight and self.waiting == 0:
            self.in_flight += 1
            return True
        return False

    async def acquire(self, priority: int = 0) -> float:
        """Wait for a slot; returns the seconds waited."""
        if self.try_acquire():
            return 0.0
        if self.waiting >= self.cfg.max_queue:
            raise unavailable("the model is at capacity (queue full); retry later", "queue_full",
                              retry_after=1.0)
        t0 = time.monotonic()
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self.heap, (priority, next(self.seq), fut))
        self.waiting += 1
        try:
            # asyncio.wait (not wait_for) so a slot handed over at the timeout's edge is never lost.
            await asyncio.wait([fut], timeout=self.cfg.queue_timeout_s)
        except BaseException:  # the client went away while queued
            if fut.done():
                self.release()  # we had been handed a slot: pass it on
            else:
                fut.cancel()
                self.waiting -= 1
            raise
        if not fut.done():
            fut.cancel()
            self.waiting -= 1
            raise unavailable(f"queued for {self.cfg.queue_timeout_s:g}s without a free slot; retry later",
                              "queue_timeout", retry_after=1.0)
        return time.monotonic() - t0

    def release(self) -> None:
        while self.heap:
            _, _, fut = heapq.heappop(self.heap)
            if not fut.done():
                self.waiting -= 1
                fut.set_result(None)  # the slot passes straight to the waiter: in_flight unchanged
                return
        self.in_flight -= 1
