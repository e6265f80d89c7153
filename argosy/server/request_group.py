"""The engine requests behind one HTTP request, as the event loop sees them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from argosy.engine.outputs import RequestOutput
from argosy.engine.sampling_params import SamplingParams


@dataclass(slots=True)
class EngineRequest:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    priority: int = 0
    cache_salt: str | None = None


class OutputObserver(Protocol):
    """Sees every delivered output and every abort, on the event loop (the server's metrics)."""

    def on_output(self, out: RequestOutput, arrival: float, now: float) -> None: ...

    def on_abort(self, request_ids: list[str], num_completions: int) -> None: ...


class RequestGroup:
    """The engine requests behind one HTTP request (one per prompt) and their newest outputs."""

    def __init__(self, requests: list[EngineRequest], arrival: float, accepted: asyncio.Future[None]):
        self.requests = requests
        self.arrival = arrival  # time.monotonic() when the HTTP request came in
        self.accepted = accepted  # resolved once the engine thread queued every request (or one failed)
        self.unfinished: set[str] = {r.request_id for r in requests}
        self.unstarted: set[str] = set(self.unfinished)  # no output yet: counts as waiting for admission
        self.n = {r.request_id: r.params.n for r in requests}  # sequences per request: what admission counts
        self.sequences = sum(self.n.values())
        self.final: dict[str, RequestOutput] = {}
        self._fresh: dict[str, RequestOutput] = {}
        self._waiter: asyncio.Future[None] | None = None  # a bare future: cheaper than an Event per token
        self._error: BaseException | None = None

    def _push(self, out: RequestOutput) -> None:
        self._fresh[out.request_id] = out
        if out.finished:
            self.unfinished.discard(out.request_id)
            self.final[out.request_id] = out
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_outputs(self) -> list[RequestOutput]:
        """The newest output of each request that progressed since the last call; [] once all finished."""
        while not self._fresh:
            if self._error is not None:
                raise self._error
            if not self.unfinished:
                return []
            self._waiter = self.accepted.get_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._error is not None:
            raise self._error
        fresh = list(self._fresh.values())
        self._fresh.clear()
        return fresh

    async def wait_finished(self) -> list[RequestOutput]:
        """The final outputs, in the order of `requests`."""
        while await self.next_outputs():
            pass
        return [self.final[r.request_id] for r in self.requests]
