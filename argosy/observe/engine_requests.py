"""Per-request context of `argosy engine`: the request's ids in the logs, its trace, its access-log line.

An ASGI middleware around the server's generation endpoints. The handlers record the engine requests
they submit (`note_group`, called by ServerState.submit) in a list this middleware keeps in a
ContextVar; once the response is complete it reads their final outputs for the engine spans and the
access line. Streamed chunks bypass it (they go to the server's raw `send`, see server/streaming.py):
it only sees the response start, so it costs nothing per token.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import Any

from argosy.observe.logs import ACCESS, bind_request, request_headers, trace_id_from, unbind_request
from argosy.observe.tracing import Tracing, record_engine_spans

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
_groups: contextvars.ContextVar[list | None] = contextvars.ContextVar("argosy_groups", default=None)


def note_group(group: Any) -> None:
    """Remember a submitted RequestGroup for the request being served (no-op outside the middleware)."""
    groups = _groups.get()
    if groups is not None:
        groups.append(group)


class EngineRequestContext:
    def __init__(self, app: Any, served_model_name: str, tracing: Tracing | None):
        self.app, self.model, self.tracing = app, served_model_name, tracing

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] not in GENERATION_PATHS:
            return await self.app(scope, receive, send)
        t0 = time.monotonic()
        rid, parent = request_headers(scope)
        trace = None
        if self.tracing is not None:
            trace = self.tracing.start_request(f"POST {scope['path']}", parent, {
                "http.request.method": "POST", "url.path": scope["path"], "argosy.request_id": rid,
                "gen_ai.request.model": self.model})
        ids = bind_request(rid, trace.trace_id if trace else trace_id_from(parent))
        groups: list = []
        groups_token = _groups.set(groups)
        status = 0

        async def send_noting_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        except asyncio.CancelledError:
            status = status or 499
            raise
        finally:
            _groups.reset(groups_token)
            try:
                self._finish(trace, groups, status or 500, t0)
            finally:
                unbind_request(ids)

    def _finish(self, trace, groups: list, status: int, t0: float) -> None:
        log = ACCESS.isEnabledFor(logging.INFO)
        if trace is None and not log:
            return
        finals = [g.final[r.request_id] for g in groups for r in g.requests if r.request_id in g.final]
        if trace is not None:
            record_engine_spans(trace, finals)
            trace.end(status)
        if log:
            fields: dict[str, Any] = {"model": self.model, "status": status,
                                      "latency_ms": round((time.monotonic() - t0) * 1000, 2),
                                      "prompt_tokens": sum(len(o.prompt_token_ids) for o in finals),
                                      "completion_tokens": sum(len(c.token_ids) for o in finals for c in o.outputs),
                                      "cached_tokens": sum(o.num_cached_tokens for o in finals)}
            if finals:
                m = finals[0].metrics
                if m.get("first_token_time") and m.get("arrival_time"):
                    fields["ttft_ms"] = round((m["first_token_time"] - m["arrival_time"]) * 1000, 2)
            ACCESS.info("request", extra=fields)
