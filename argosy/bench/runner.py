"""Runs one load level: open loop (requests sent on a schedule, whatever the server does) or closed
loop (N workers, each sending its next request when the last one ends).

A session's turns go one after the other, each resending the history with the server's reply; only a
session's first turn has a schedule, so send lag measures the dispatcher, not the sessions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from argosy.bench.arrivals import arrival_times
from argosy.bench.client import Endpoint, cancel_all, new_session, send
from argosy.bench.progress import Progress
from argosy.bench.record import RequestRecord
from argosy.bench.workload import Job, approx_tokens


@dataclass
class LoadLevel:
    label: str
    rate: float | None = None  # open loop, req/s (sessions/s with multi-turn sessions)
    concurrency: int | None = None  # closed loop
    burstiness: float = 1.0
    ramp: tuple[float, float] | None = None
    trace: bool = False  # open loop at the jobs' own timestamps
    trace_speedup: float = 1.0


@dataclass
class RunLimits:
    duration_s: float | None = None
    num_requests: int | None = None
    seed: int = 0


class Run:
    def __init__(self, ep: Endpoint, level: LoadLevel, limits: RunLimits, jobs: Iterable[Job], progress: Progress,
                 max_connections: int = 0):
        self.ep, self.level, self.limits, self.progress = ep, level, limits, progress
        self.jobs: Iterator[Job] = iter(jobs)
        self.max_connections = max_connections
        self.records: list[RequestRecord] = []
        self.start = 0.0
        self.started_unix = 0.0  # wall clock at `start`: relates the records to server logs

    def _past_deadline(self) -> bool:
        d = self.limits.duration_s
        return d is not None and time.perf_counter() - self.start > d

    def _budget_left(self) -> bool:
        n = self.limits.num_requests
        return n is None or len(self.records) < n

    async def _session(self, http, job: Job, scheduled_s: float | None) -> None:
        messages: list[dict[str, str]] = [{"role": "system", "content": job.system}] if job.system else []
        for turn_no, turn in enumerate(job.turns):
            if turn_no > 0 and (self._past_deadline() or not self._budget_left()):
                return
            messages.append({"role": "user", "content": turn.text})
            rec = RequestRecord(index=len(self.records), sent_s=0.0, session=job.index, turn=turn_no,
                                scheduled_s=scheduled_s if turn_no == 0 else None,
                                prompt_tokens_target=sum(approx_tokens(m["content"]) for m in messages),
                                output_tokens_target=turn.output_tokens)
            self.records.append(rec)
            self.progress.request_started()
            reply = await send(http, self.ep, self.ep.body(messages, turn.output_tokens), rec, self.start)
            self.progress.request_done(rec.ok)
            if not rec.ok:
                return  # a broken session stops: its history would be wrong
            messages.append({"role": "assistant", "content": reply})

    def _schedule(self) -> Iterator[tuple[float, Job]]:
        lv, lim = self.level, self.limits
        if lv.trace:
            for job in self.jobs:
                t = (job.at_s or 0.0) / lv.trace_speedup
                if lim.duration_s is not None and t > lim.duration_s:
                    return
                yield t, job
            return
        times = arrival_times(lv.rate or 0.0, burstiness=lv.burstiness, seed=lim.seed + 1,
                              duration_s=lim.duration_s, num=lim.num_requests, ramp=lv.ramp)
        yield from zip(times, self.jobs, strict=False)

    async def _open_loop(self, http) -> None:
        tasks: set[asyncio.Task] = set()
        try:
            for t, job in self._schedule():
                if not self._budget_left():
                    break
                # A loop: the event loop's timers may fire up to a millisecond early.
                while (delay := self.start + t - time.perf_counter()) > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(self._session(http, job, t))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(0)  # let it start now: its send time is what we record as sent
            await asyncio.gather(*tasks)
        finally:
            await cancel_all(tasks)

    async def _closed_loop(self, http) -> None:
        async def worker() -> None:
            while not self._past_deadline() and self._budget_left():
                job = next(self.jobs, None)
                if job is None:
                    return
                await self._session(http, job, None)

        workers = [asyncio.create_task(worker()) for _ in range(self.level.concurrency or 1)]
        try:
            await asyncio.gather(*workers)
        finally:
            await cancel_all(set(workers))

    async def execute(self) -> list[RequestRecord]:
        limit = self.max_connections or 0
        async with new_session(limit) as http:
            self.start, self.started_unix = time.perf_counter(), time.time()
            self.progress.start()
            try:
                if self.level.concurrency is not None:
                    await self._closed_loop(http)
                else:
                    await self._open_loop(http)
            finally:
                await self.progress.stop()
        return self.records
