"""Per-request context of the gateway: the request's ids in the logs, its server span, its access-log line.

`serve_request` wraps the gateway's handler for one proxied request. The request id is the caller's
X-Request-Id (when sane) or a new one; it goes to the upstream and back to the caller in the same
header, so one id joins the gateway's and the replica's log lines. The caller's W3C `traceparent`
is the parent of the gateway's server span; with tracing off it is passed through unchanged (and its
trace id still goes into the logs).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from argosy.observe.logs import ACCESS, bind_request, request_headers, trace_id_from, unbind_request
from argosy.observe.tracing import RequestTrace, Tracing


@dataclass(slots=True)
class GatewayRequest:
    request_id: str
    trace: RequestTrace | None
    upstream_headers: dict[str, str]  # what every attempt sends (an upstream span adds its traceparent)
    call: Any = None  # the proxy's Call, once the request is routed
    attributes: dict[str, Any] = field(default_factory=dict)  # for the server span and the access line


async def serve_request(tracing: Tracing | None, scope, path: str,
                        handle: Callable[[GatewayRequest], Awaitable[None]]) -> None:
    t0 = time.monotonic()
    rid, parent = request_headers(scope)
    headers = {"content-type": "application/json", "x-request-id": rid}
    trace = None
    if tracing is not None:
        trace = tracing.start_request(f"POST {path}", parent, {
            "http.request.method": "POST", "url.path": path, "argosy.request_id": rid})
    elif parent is not None and trace_id_from(parent):
        headers["traceparent"] = parent.decode("latin-1")  # not tracing here: pass the caller's trace on
    rq = GatewayRequest(rid, trace, headers)
    ids = bind_request(rid, trace.trace_id if trace else trace_id_from(parent))
    status = 500
    try:
        await handle(rq)
        status = rq.call.status if rq.call is not None and rq.call.status else 200
    except asyncio.CancelledError:
        status = 499  # the caller went away
        raise
    except Exception as e:  # a GatewayError carries the status the caller got
        status = getattr(e, "status", 500)
        raise
    finally:
        try:
            _finish(rq, status, t0)
        finally:
            unbind_request(ids)


def _finish(rq: GatewayRequest, status: int, t0: float) -> None:
    call, log = rq.call, ACCESS.isEnabledFor(logging.INFO)
    if rq.trace is None and not log:
        return
    fields = rq.attributes
    if call is not None:
        fields.update({"model": call.model, "revision": call.route, "upstream": call.upstream,
                       "retries": call.retries, "stream": call.stream})
    if rq.trace is not None:
        rq.trace.end(status, {f"argosy.{k}": v for k, v in fields.items() if v is not None})
    if log:
        ACCESS.info("request", extra={**fields, "status": status,
                                      "latency_ms": round((time.monotonic() - t0) * 1000, 2)})
