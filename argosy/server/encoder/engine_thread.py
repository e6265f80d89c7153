"""Runs the EncoderEngine (not thread-safe) in one dedicated thread; requests are awaited on asyncio.

The engine thread loads the model, runs one warm-up input, then loops: apply the queued adds and
aborts, run a batch while inputs wait, sleep on a condition variable when idle. A finished request's
result goes to its future through `call_soon_threadsafe`; the event loop never waits on the engine.
Tokenization happens before a request gets here, on the event loop's thread pool (the tokenizer
releases the GIL), so it overlaps the model.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from argosy.encoder.engine import EncoderOutput
from argosy.startup_heap import freeze_startup_heap

STATS_INTERVAL_S = 0.02


class EncoderStopped(RuntimeError):
    """The engine thread failed or stopped; the request cannot run."""


class AsyncEncoder:
    def __init__(self, make_engine: Callable[[], Any]):
        self._make_engine = make_engine
        self._cv = threading.Condition()
        self._adds: list[tuple[str, list, float, asyncio.Future]] = []
        self._aborts: list[str] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="argosy-encoder", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._futures: dict[str, asyncio.Future] = {}
        self._on_ready: Callable[[], None] = lambda: None
        self._on_failed: Callable[[BaseException], None] = lambda exc: None
        # Published by the engine thread, read by everyone else.
        self.engine: Any = None
        self.stats: dict[str, Any] = {}
        self.ready = False
        self.failed: BaseException | None = None
        self.pending_requests = 0  # handed to the engine thread, not yet in its stats
        self.pending_tokens = 0

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
        """Requests not finished (admission counts these against --max-queue)."""
        return len(self._futures)

    def queue(self) -> dict[str, int]:
        """Waiting and running requests, and the tokens still to run (the fleet's encoder metric)."""
        s = self.stats
        return {"waiting": int(s.get("num_waiting", 0)) + self.pending_requests,
                "running": int(s.get("num_running", 0)),
                "queued_tokens": int(s.get("queued_tokens", 0)) + self.pending_tokens}

    async def run(self, request_id: str, inputs: list, arrival: float) -> EncoderOutput:
        """Queues the tokenized inputs and waits for their vectors or scores. Raises the engine's
        EncoderInputError for a bad input; a cancelled caller (client gone) aborts the request."""
        if self.failed is not None:
            raise EncoderStopped("the encoder engine is not running")
        assert self._loop is not None
        future = self._loop.create_future()
        self._futures[request_id] = future
        tokens = sum(len(x[0] if isinstance(x, tuple) else x) for x in inputs)
        self.pending_tokens += tokens
        self.pending_requests += 1
        with self._cv:
            self._adds.append((request_id, inputs, arrival, future))
            self._cv.notify()
        try:
            return await future
        except asyncio.CancelledError:
            with self._cv:
                self._aborts.append(request_id)
                self._cv.notify()
            raise
        finally:
            self._futures.pop(request_id, None)

    def _settle(self, results: list[tuple[asyncio.Future, Any, BaseException | None]], accepted: tuple[int, int]
                ) -> None:
        self.pending_requests -= accepted[0]
        self.pending_tokens -= accepted[1]
        for future, value, error in results:
            if future.done():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

    def _died(self, exc: BaseException) -> None:
        self.failed = exc
        for future in list(self._futures.values()):
            if not future.done():
                future.set_exception(EncoderStopped(f"the encoder engine stopped: {type(exc).__name__}"))
        self._on_failed(exc)

    def _loaded(self) -> None:
        freeze_startup_heap()  # the model and what loading it made: out of every later collection
        self.ready = True
        self._on_ready()

    # ---- engine thread -----------------------------------------------------------------------------

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the event loop closed during shutdown
            pass

    def _run(self) -> None:
        try:
            engine = self._make_engine()
            engine.add_request("argosy-warmup", [[engine.tokenizer.pad_id] * 8])
            while engine.has_unfinished_requests():
                engine.step()
        except BaseException as exc:
            traceback.print_exc(file=sys.stderr)
            self._post(self._died, exc)
            return
        self.engine = engine
        self.stats = dict(engine.stats())
        self._post(self._loaded)
        try:
            self._serve(engine)
        except BaseException as exc:  # a bug outside a batch: fail loudly rather than hang every request
            traceback.print_exc(file=sys.stderr)
            self._post(self._died, exc)

    def _serve(self, engine: Any) -> None:
        futures: dict[str, asyncio.Future] = {}  # requests the engine holds
        last_stats = 0.0
        while True:
            with self._cv:
                if not self._adds and not self._aborts and not engine.has_unfinished_requests():
                    self.stats = dict(engine.stats())
                    while not self._adds and not self._aborts and not self._stopping:
                        self._cv.wait()
                if self._stopping:
                    return
                adds, self._adds = self._adds, []
                aborts, self._aborts = self._aborts, []
            settled: list[tuple[asyncio.Future, Any, BaseException | None]] = []
            accepted = (len(adds), sum(len(x[0] if isinstance(x, tuple) else x) for _, inputs, _, _ in adds
                                       for x in inputs))
            for request_id, inputs, arrival, future in adds:
                try:
                    engine.add_request(request_id, inputs, arrival)
                    futures[request_id] = future
                except Exception as exc:  # EncoderInputError -> 400/413; anything else -> 500
                    settled.append((future, None, exc))
            for request_id in aborts:
                engine.abort_request(request_id)
                futures.pop(request_id, None)
            if adds:
                self.stats = dict(engine.stats())
            if engine.has_unfinished_requests():
                try:
                    outputs = engine.step()
                except Exception as exc:
                    traceback.print_exc(file=sys.stderr)
                    error = EncoderStopped(f"the encoder failed on a batch: {type(exc).__name__}")
                    for request_id, future in futures.items():
                        engine.abort_request(request_id)
                        settled.append((future, None, error))
                    futures.clear()
                    outputs = []
                for out in outputs:
                    future = futures.pop(out.request_id, None)
                    if future is not None:
                        settled.append((future, out, None))
            now = time.monotonic()
            if now - last_stats >= STATS_INTERVAL_S:
                self.stats, last_stats = dict(engine.stats()), now
            if settled or adds:
                self._post(self._settle, settled, accepted)
