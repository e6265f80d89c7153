"""Runs the LLMEngine (not thread-safe) in one dedicated thread and hands its outputs to asyncio.

The engine thread owns the engine: it loads it, warms it up, then loops: apply the queued add/abort
commands, step while there is work, and sleep on a condition variable when idle (never spins). Each
step's outputs go to the event loop in one `call_soon_threadsafe`; there each HTTP request's
`RequestGroup` keeps only the newest (cumulative) output per engine request, so a slow reader gets
bigger deltas instead of a growing backlog. The event loop never waits on the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from argosy.engine.outputs import RequestOutput
from argosy.engine.sampling_params import SamplingParams
from argosy.server.request_group import EngineRequest, OutputObserver, RequestGroup
from argosy.startup_heap import freeze_startup_heap

__all__ = ["AsyncEngine", "EngineRequest", "EngineStepError", "OutputObserver", "RequestGroup"]

_ADD, _ABORT = 0, 1
STATS_INTERVAL_S = 0.02  # engine.stats() snapshot period while busy (gauges and admission read it)


def _name_os_thread(name: str) -> None:
    """Names the calling thread for the OS too (top -H, ps -L, /proc/PID/task/*/comm), where Python 3.11
    names only its own object: `argosy profile` tells the engine's CPU time from the event loop's by it."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(15, name.encode()[:15])  # PR_SET_NAME (Linux); elsewhere nothing happens


class EngineStepError(RuntimeError):
    """The engine failed while running a step; the requests in flight were aborted."""


class AsyncEngine:
    def __init__(self, make_engine: Callable[[], Any], observer: OutputObserver | None = None):
        self._make_engine = make_engine
        self.observer = observer
        self._cv = threading.Condition()
        self._commands: list[tuple[int, Any]] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="argosy-engine", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        # Event-loop side state.
        self._groups: dict[str, RequestGroup] = {}
        self._num_unstarted = 0
        self._pending_adds = 0
        self._on_ready: Callable[[], None] | None = None
        self._on_failed: Callable[[BaseException], None] | None = None
        # Published by the engine thread; read-only for everyone else.
        self.stats: dict[str, Any] = {}
        self.tokenizer: Any = None
        self.max_model_len = 0
        self.ready = False
        self.failed: BaseException | None = None

    # ---- event-loop side -------------------------------------------------------------------------

    def start(self, on_ready: Callable[[], None], on_failed: Callable[[BaseException], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_ready, self._on_failed = on_ready, on_failed
        self._thread.start()

    async def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        await asyncio.to_thread(self._thread.join, 30)

    def alive(self) -> bool:
        return self.failed is None and (self._thread.is_alive() or not self.ready)

    def num_waiting(self) -> int:
        """Sequences not started yet (a request's n completions are n), for admission: ours (queued to the
        engine thread, or waiting for their first token) or the engine's own count (preempted ones), whichever
        is larger."""
        return max(self._num_unstarted, self.stats.get("num_waiting", 0) + self._pending_adds)

    def engine_stats(self) -> dict[str, Any]:
        stats = dict(self.stats)
        stats["num_waiting"] = stats.get("num_waiting", 0) + self._pending_adds
        return stats

    async def add(self, requests: list[EngineRequest], arrival: float) -> RequestGroup:
        """Queues the requests; returns once the engine accepted all of them. Raises the engine's
        InvalidRequestError when one is invalid (then none of them runs)."""
        assert self._loop is not None
        group = RequestGroup(requests, arrival, self._loop.create_future())
        for r in requests:
            self._groups[r.request_id] = group
        self._num_unstarted += group.sequences
        self._pending_adds += group.sequences
        self._send((_ADD, group))
        try:
            await group.accepted
        except asyncio.CancelledError:
            self.abort(group)
            raise
        return group

    def abort(self, group: RequestGroup) -> None:
        """Stops the group's unfinished requests; the engine frees their KV blocks at its next command."""
        ids = self._forget(group)
        if not ids:
            return
        if self.observer is not None:
            n = sum(r.params.n for r in group.requests if r.request_id in ids)
            self.observer.on_abort(ids, n)
        self._send((_ABORT, ids))

    def _forget(self, group: RequestGroup) -> list[str]:
        """Drops the group's unfinished requests from the event-loop bookkeeping; returns their ids."""
        ids = list(group.unfinished)
        for rid in ids:
            self._groups.pop(rid, None)
        self._num_unstarted -= sum(group.n[rid] for rid in group.unstarted)
        group.unstarted.clear()
        group.unfinished.clear()
        return ids

    def _live_groups(self) -> list[RequestGroup]:
        return list({id(g): g for g in self._groups.values()}.values())

    def _send(self, command: tuple[int, Any]) -> None:
        with self._cv:
            self._commands.append(command)
            self._cv.notify()

    def _on_added(self, results: list[tuple[RequestGroup, BaseException | None]]) -> None:
        for group, error in results:
            self._pending_adds -= group.sequences
            if error is not None:
                self._forget(group)
            if not group.accepted.done():
                if error is None:
                    group.accepted.set_result(None)
                else:
                    group.accepted.set_exception(error)

    def _deliver(self, outputs: list[RequestOutput], now: float) -> None:
        groups, observer = self._groups, self.observer
        for out in outputs:
            rid = out.request_id
            group = groups.get(rid)
            if group is None:  # aborted meanwhile
                continue
            if rid in group.unstarted:
                group.unstarted.discard(rid)
                self._num_unstarted -= group.n[rid]
            if observer is not None:
                observer.on_output(out, group.arrival, now)
            group._push(out)
            if out.finished:
                del groups[rid]

    def _on_step_error(self, exc: BaseException) -> None:
        error = EngineStepError(f"The engine failed: {type(exc).__name__}.")
        for group in self._live_groups():
            self.abort(group)
            group._fail(error)

    def _loaded(self) -> None:
        freeze_startup_heap()  # the model and what loading it made: out of every later collection
        self.ready = True
        if self._on_ready is not None:
            self._on_ready()

    def _died(self, exc: BaseException) -> None:
        """Loading failed, or the engine thread stopped on an unexpected error: nothing can run."""
        self.failed = exc
        error = EngineStepError(f"The engine stopped: {type(exc).__name__}.")
        for group in self._live_groups():
            self._forget(group)
            group._fail(error)
            if not group.accepted.done():
                group.accepted.set_exception(error)
        if self._on_failed is not None:
            self._on_failed(exc)

    # ---- engine thread -----------------------------------------------------------------------------

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the event loop closed during shutdown
            pass

    def _run(self) -> None:
        _name_os_thread("argosy-engine")
        try:
            engine = self._make_engine()
            _warm_up(engine)
        except BaseException as exc:
            traceback.print_exc(file=sys.stderr)
            self._post(self._died, exc)
            return
        self.tokenizer, self.max_model_len = engine.tokenizer, engine.max_model_len
        self.stats = dict(engine.stats())
        self._post(self._loaded)
        try:
            self._serve(engine)
        except BaseException as exc:  # a bug outside step(): fail loudly rather than hang every request
            traceback.print_exc(file=sys.stderr)
            self._post(self._died, exc)

    def _serve(self, engine: Any) -> None:
        live: set[str] = set()  # request ids the engine holds unfinished
        last_stats = 0.0
        while True:
            with self._cv:
                if not self._commands and not engine.has_unfinished_requests():
                    self.stats = dict(engine.stats())
                    while not self._commands and not self._stopping:
                        self._cv.wait()
                if self._stopping:
                    if hasattr(engine, "close"):
                        engine.close()  # ends tensor/pipeline-parallel workers, if any
                    return
                commands, self._commands = self._commands, []
            if commands:
                self._apply(engine, commands, live)
            if not engine.has_unfinished_requests():
                continue
            try:
                outputs = engine.step()
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                for rid in live:
                    _abort_quietly(engine, rid)
                live.clear()
                self._post(self._on_step_error, exc)
                continue
            now = time.monotonic()
            for out in outputs:
                if out.finished:
                    live.discard(out.request_id)
            if outputs:
                self._post(self._deliver, outputs, now)
            if now - last_stats >= STATS_INTERVAL_S:
                self.stats, last_stats = dict(engine.stats()), now

    def _apply(self, engine: Any, commands: list[tuple[int, Any]], live: set[str]) -> None:
        results: list[tuple[RequestGroup, BaseException | None]] = []
        for kind, payload in commands:
            if kind == _ABORT:
                for rid in payload:
                    if rid in live:
                        _abort_quietly(engine, rid)
                        live.discard(rid)
                continue
            group: RequestGroup = payload
            # The engine's times (queue, TTFT) count from the HTTP arrival, as the metrics do.
            added: list[str] = []
            error: BaseException | None = None
            for r in group.requests:
                try:
                    engine.add_request(r.request_id, r.prompt, r.params, priority=r.priority,
                                       cache_salt=r.cache_salt, arrival_time=group.arrival)
                except Exception as exc:  # InvalidRequestError -> 400; anything else -> 500
                    error = exc
                    break
                added.append(r.request_id)
            if error is not None:
                for rid in added:
                    _abort_quietly(engine, rid)
            else:
                live.update(added)
            results.append((group, error))
        if results:
            self._post(self._on_added, results)


def _abort_quietly(engine: Any, request_id: str) -> None:
    try:
        engine.abort_request(request_id)
    except Exception:  # already gone: nothing left to free
        pass


def _warm_up(engine: Any) -> None:
    """One short greedy request, so the first user does not pay for lazy initialisation."""
    engine.add_request("argosy-warmup", "Hello", SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
