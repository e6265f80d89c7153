"""Forwarding one request to an upstream: retries before the first byte, streaming after it.

A request that fails before its first byte (connection refused or reset, a 5xx, a 429) is retried on
another upstream, within `max_retries` and a retry budget. Once the first byte has gone to the user,
a stream is never replayed: an upstream failure ends it with an error event and `data: [DONE]`.
Streamed chunks pass through as received (no re-encoding) unless output guardrails need the text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from argosy.gateway.errors import GatewayError, unavailable
from argosy.gateway.guardrails import Blocked
from argosy.gateway.health import Upstream
from argosy.gateway.router import Router, RouteRequest
from argosy.gateway.stream import StreamFilter, rewrite_full
from argosy.gateway.upstream_client import Response, UpstreamClient, UpstreamTimeout
from argosy.observe.tracing import mark_first_token, set_http_status

log = logging.getLogger("argosy.gateway")
RETRYABLE = {429, 500, 502, 503, 504}


class ClientGone(Exception):
    """The user disconnected before its answer (see unless_gone)."""


async def unless_gone(aw, disconnected: asyncio.Future | None):
    """`aw`'s result, or ClientGone (with `aw` cancelled, which frees what it holds) if the user disconnects
    first: for the admission queue, a cold start, and an upstream call up to its (first) bytes. A stream's
    later chunks come a few ms apart, and `_stream` checks between them, with no task per chunk."""
    if disconnected is None:  # nothing to watch (the app wraps a non-streamed call whole): no task
        return await aw
    task = asyncio.ensure_future(aw)
    try:
        await asyncio.wait([task, disconnected], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            # It finished as it was cancelled (a slot handed over, a response head): the caller's to use
            # and release, as if the user were still there.
            return await task
        raise ClientGone
    return task.result()


async def unless_gone_or_499(aw, gone: asyncio.Future):
    """unless_gone for a step of a request's handling: a client that left ends the request with 499
    client_disconnected (nobody reads it)."""
    try:
        return await unless_gone(aw, gone)
    except ClientGone:
        raise GatewayError(499, "the client closed the connection before its answer", "invalid_request_error",
                           "client_disconnected") from None


DONE = b"data: [DONE]\n\n"
JSON_HEADERS = {"content-type": "application/json"}


@dataclass
class Call:
    model: str
    route: str  # the traffic revision
    path: str
    body: bytes
    stream: bool
    rreq: RouteRequest
    tokens: int  # estimate, for load accounting
    router: Router
    t0: float
    guard: object | None = None  # Guardrails when the model has output checks
    keep_output: bool = False  # collect the response (shadow comparison, usage, debug log)
    status: int = 0
    upstream: str = ""
    output: list[bytes] = field(default_factory=list)
    completion_events: int = 0
    retries: int = 0
    trace: Any = None  # argosy.observe.tracing.RequestTrace when tracing is on
    headers: dict[str, str] = field(default_factory=JSON_HEADERS.copy)  # to the upstream (x-request-id, ...)
    request_id: str = ""  # returned to the caller as X-Request-Id
    shadow_out: asyncio.Future | None = None  # a shadow request waits for this output to compare
    reply_headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # to the caller (x-argosy-region)
    # Called once when the router has no upstream left before the first byte: may point the call at another
    # region (its router, headers) and return True (docs/regions.md: failover on health, per request).
    failover: Any = None
    fallback: tuple[str, Router] | None = None  # (the stable revision, its router): where a request goes
    # when its own revision has no upstream left before the first byte
    refused: tuple[str, bool] | None = None  # the last upstream's refusal: (what, whether busy), for the final 503
    ttft: float | None = None  # streamed: seconds to the first chunk
    gaps: list[float] | None = None  # streamed, when the model records samples: seconds between chunks
    recorded: bool = False  # a sample for the model's rollout analysis (generations only, not /tokenize)
    before_last: bytes = b""  # a stream's last two chunks: where its usage is, when the client asked for it
    last: bytes = b""


def stream_error(message: str, code: str) -> bytes:
    err = {"error": {"message": message, "type": "upstream_error", "param": None, "code": code}}
    return b"data: " + json.dumps(err).encode() + b"\n\n" + DONE


class Proxy:
    def __init__(self, session: aiohttp.ClientSession, metrics, max_retries: int, retry_budget: float,
                 retry_after: float, client: UpstreamClient):
        self.session, self.m = session, metrics
        self.client = client  # http:// upstreams; https:// ones go through aiohttp's session
        self.max_retries, self.retry_rate = max_retries, retry_budget
        self.budget = 10.0  # retry tokens: each request adds retry_rate (capped), each retry spends 1
        self.retry_after = retry_after

    def _may_retry(self, call: Call) -> bool:
        if call.retries >= self.max_retries or self.budget < 1:
            return False
        self.budget -= 1
        call.retries += 1
        return True

    async def forward(self, call: Call, send, disconnected: asyncio.Future | None) -> None:
        self.budget = min(10.0, self.budget + self.retry_rate)
        tried: set[str] = set()
        last_error, busy = "no live upstream", False  # the last refusal, and whether it said "busy"
        while True:
            route = call.trace.child("gateway.route", {"argosy.revision": call.route}) if call.trace else None
            u = call.router.choose(call.rreq, tried)
            if u is None and call.fallback is not None:  # the revision has nothing left: the stable's
                (call.route, call.router), call.fallback = call.fallback, None
                u = call.router.choose(call.rreq, tried)
            if u is None and call.failover is not None:  # the region has nothing left: another region's
                go, call.failover = call.failover, None
                if go(call):
                    u = call.router.choose(call.rreq, tried)
            if route is not None:
                route.set_attribute("argosy.upstream", u.url if u is not None else "none")
                route.end()
            if u is None:
                what = "its upstreams are busy" if busy else "no live upstream"
                raise unavailable(f"model {call.model!r}: {what} ({last_error}); retry later", "no_upstream",
                                  retry_after=self.retry_after)
            tried.add(u.url)
            call.upstream = u.url
            span = None  # one upstream span per attempt: a retry is a sibling span
            if call.trace is not None:
                span = call.trace.child("gateway.upstream", {"argosy.upstream": u.url, "url.path": call.path,
                                                             "argosy.attempt": len(tried)}, client=True)
            u.on_start(call.tokens)
            try:
                done = await self._attempt(call, u, send, disconnected, span)
            except UpstreamTimeout as e:  # it took the request and went silent: waiting again elsewhere doubles it
                u.failure()
                log.warning("upstream %s timed out before the first byte: %s", u.url, e)
                if span is not None:
                    set_http_status(span, 0, str(e))
                raise GatewayError(504, f"model {call.model!r}: {e}; retry later", "upstream_error",
                                   "upstream_timeout", retry_after=self.retry_after) from None
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                u.failure()
                last_error, busy = f"{type(e).__name__} from {u.url}", False
                log.warning("upstream %s failed before the first byte: %s", u.url, type(e).__name__)
                done = False
                if span is not None:
                    set_http_status(span, 0, last_error)
            finally:
                u.on_end(call.tokens)
                if span is not None:
                    span.end()
            if done:
                return
            if call.refused is not None:
                (last_error, busy), call.refused = call.refused, None
            if not self._may_retry(call):
                what = "its upstreams are busy" if busy else "upstream failed"
                raise unavailable(f"model {call.model!r}: {what} ({last_error}); retry later",
                                  "upstream_unavailable", retry_after=self.retry_after)
            self.m.retries.labels(call.model, u.url).inc()

    async def _attempt(self, call: Call, u: Upstream, send, disconnected, span=None) -> bool:
        """True when the user got an answer; False to retry elsewhere (nothing was sent yet)."""
        headers = call.headers if span is None else call.trace.inject(span, call.headers)
        t_sent = time.monotonic()
        post = self.client.post if u.url.startswith("http://") else self._post_https
        try:  # a replica may send a stream's head only with its first token: the user may leave before either
            resp = await unless_gone(post(u.url + call.path, call.body, headers), disconnected)
        except ClientGone:
            call.status = 499
            return True  # nobody to answer; the cancelled request's connection is closed: the upstream aborts
        if span is not None:
            set_http_status(span, resp.status)
        rid = [(b"x-request-id", call.request_id.encode())] if call.request_id else []
        rid += [*call.reply_headers, *u.reply_headers]  # a region upstream names itself (x-argosy-region)
        rid.append((b"x-argosy-revision", call.route.encode()))  # which revision answered (rollouts)
        try:
            if resp.status in RETRYABLE:
                await resp.read()
                # A 429, or a 503 with Retry-After (a replica's full queue), is a busy upstream, not a broken one:
                # counted as failures, a burst of large requests ejected every replica of the model.
                busy = resp.status == 429 or (resp.status == 503 and "retry-after" in resp.headers)
                if not busy:
                    u.failure()
                call.refused = (f"{resp.status}{' (busy)' if busy else ''} from {u.url}", busy)
                return False
            ctype = resp.headers.get("content-type", "application/json").encode()
            if not call.stream or resp.status != 200 or not ctype.startswith(b"text/event-stream"):
                body = await resp.read()
                u.success()
                call.status = resp.status
                if call.keep_output or call.guard is not None:
                    call.output.append(body)
                if call.guard is not None and resp.status == 200:
                    body = await self._check_full(call, body, send)
                    if body is None:
                        return True
                await send({"type": "http.response.start", "status": call.status, "headers": [
                    (b"content-type", ctype), (b"content-length", str(len(body)).encode()), *rid]})
                await send({"type": "http.response.body", "body": body})
                self.m.ttft.labels(call.model, call.route, u.url).observe(time.monotonic() - call.t0)
                if span is not None:
                    mark_first_token(span, call.t0)
                return True
            try:  # still retryable until this arrives
                first = await unless_gone(self._first_chunk(resp, t_sent), disconnected)
            except ClientGone:  # it left during the prefill (or the replica's queue): nobody to answer
                call.status = 499
                return True  # releasing resp aborts the upstream request
            if not first:
                u.failure()
                call.refused = (f"a stream that ended before its first chunk from {u.url}", False)
                return False
            u.success()
            call.status = 200
            if span is not None:
                mark_first_token(span, call.t0)
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), *rid]})
            await self._stream(call, u, resp, first, send, disconnected)
            return True
        finally:
            resp.release()

    async def _post_https(self, url: str, body: bytes, headers: dict[str, str]):
        c = self.client
        timeout = aiohttp.ClientTimeout(total=None, connect=c.connect_timeout_s, sock_read=c.idle_read_timeout_s)
        try:
            async with asyncio.timeout(c.first_byte_timeout_s):
                return await self.session.post(url, data=body, headers=headers, timeout=timeout)
        except TimeoutError:
            raise UpstreamTimeout(f"no response from the upstream within {c.first_byte_timeout_s:g} s",
                                  first_byte=True) from None

    async def _first_chunk(self, resp, t_sent: float) -> bytes:
        """A stream's first bytes, within what is left of the first-byte timeout."""
        left = max(0.0, self.client.first_byte_timeout_s - (time.monotonic() - t_sent))
        if isinstance(resp, Response):
            return await resp.readany(left)
        try:
            async with asyncio.timeout(left):
                return await resp.content.readany()
        except TimeoutError:
            raise UpstreamTimeout(f"no response from the upstream within {self.client.first_byte_timeout_s:g} s",
                                  first_byte=True) from None

    async def _check_full(self, call: Call, body: bytes, send) -> bytes | None:
        """Output guardrails on a whole (non-streamed) response; None when it was blocked (error sent)."""
        try:
            return await rewrite_full(call.guard, body)
        except (Blocked, GatewayError) as e:
            err = e if isinstance(e, GatewayError) else GatewayError(
                400, f"the response was blocked by a guardrail: {e}", "invalid_request_error", "content_filter")
            call.status = err.status
            await send({"type": "http.response.start", "status": err.status, "headers": err.headers()})
            await send({"type": "http.response.body", "body": err.body()})
            return None

    async def _stream(self, call: Call, u: Upstream, resp, chunk: bytes, send, disconnected) -> None:
        labels = (call.model, call.route, u.url)
        ttft, itl = self.m.ttft.labels(*labels), self.m.itl.labels(*labels)
        filt = StreamFilter(call.guard) if call.guard is not None else None
        keep = call.keep_output
        now = time.monotonic()
        call.ttft = now - call.t0
        ttft.observe(call.ttft)
        gaps = call.gaps
        last_t, saw_done, events = now, False, 0
        it = resp.content.iter_any()
        try:
            while True:
                if disconnected is not None and disconnected.done():
                    call.status = 499  # counted as the client's leaving, not as a 200 served
                    return  # the user went away: releasing resp aborts the upstream request
                events += chunk.count(b"data: ")
                if not saw_done and DONE[:12] in chunk:
                    saw_done = True
                if keep:
                    call.output.append(chunk)
                call.before_last, call.last = call.last, chunk
                if filt is not None:
                    try:
                        chunk = await filt.feed(chunk)
                    except (Blocked, GatewayError) as e:
                        await send({"type": "http.response.body", "body": stream_error(
                            f"the response was blocked by a guardrail: {e}", "content_filter"), "more_body": False})
                        return
                if chunk:
                    try:  # a client that stops reading holds the upstream only this long (Envoy: stream idle)
                        async with asyncio.timeout(self.client.idle_read_timeout_s):
                            await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    except TimeoutError:
                        log.warning("a client read nothing for %g s; its stream ends", self.client.idle_read_timeout_s)
                        call.status = 499
                        return  # releasing resp aborts the upstream request
                try:
                    chunk = await it.__anext__()
                except StopAsyncIteration:
                    break
                now = time.monotonic()
                itl.observe(now - last_t)
                if gaps is not None:
                    gaps.append(now - last_t)
                last_t = now
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            u.failure()
            log.warning("upstream %s failed mid-stream: %s", u.url, type(e).__name__)
            call.status = 502
            timed_out = isinstance(e, UpstreamTimeout)
            await send({"type": "http.response.body", "more_body": False, "body": stream_error(
                f"the upstream {'went silent' if timed_out else 'failed'} mid-stream; the response is incomplete",
                "upstream_timeout" if timed_out else "upstream_failed_mid_stream")})
            return
        finally:
            call.completion_events = events
        if not saw_done:  # the upstream closed cleanly but early: still tell the user it is incomplete
            call.status = 502
            await send({"type": "http.response.body", "more_body": False,
                        "body": stream_error("the upstream ended the stream early", "upstream_stream_truncated")})
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

