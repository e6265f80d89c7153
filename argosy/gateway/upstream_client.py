"""The gateway's HTTP/1.1 client to its upstreams: pooled keep-alive connections, parsed by httptools.

Every proxied request goes through here, so it is kept to what that needs: POST a body, read the
status and headers, then the body whole or chunk by chunk as it arrives (SSE), with flow control.
Measured here against the fast fixture upstream: 195 us a call against aiohttp's 363 us; that
difference is most of what the gateway added to a request's latency. Health checks, guardrail
calls and shadow traffic keep using aiohttp.

Errors are OSError (connection refused, reset, closed early, a malformed response) or TimeoutError
(connect, or no free connection), as the proxy's retry logic expects, and UpstreamTimeout when an
upstream that took the request stops answering: no response head within `first_byte_timeout_s`, or
nothing read for `idle_read_timeout_s` after it (the connection is closed, so the upstream aborts).
A connection taken from the pool that turns out to have been closed by the upstream meanwhile (its
keep-alive ran out) is retried once on a new one, before any byte of the answer: the upstream never
read that request. At most `max_connections` requests per upstream at once; more wait for one to
end, up to the connect timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from urllib.parse import urlsplit

import httptools

IDLE_S = 4.0  # a pooled connection idle longer is closed rather than reused (uvicorn closes at 5 s)
HIGH_WATER = 1 << 20  # bytes buffered before reading from the upstream pauses


class _Stale(ConnectionResetError):
    """A pooled connection the upstream had closed before it answered."""


class UpstreamTimeout(TimeoutError):
    """The upstream took the request and then sent nothing for too long."""

    def __init__(self, message: str, first_byte: bool):
        super().__init__(message)
        self.first_byte = first_byte  # True: nothing of the answer came (a 504 can still be sent)


class _Conn(asyncio.Protocol):
    def __init__(self, pool: UpstreamClient, key: tuple[str, int]):
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: Response | None = None
        self.closed = False
        self.idle_since = 0.0
        self._header: bytes = b""

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.resp is None:  # bytes on an idle connection: nothing asked for them, so it is not reusable
            self.closed = True
            self.transport.close()
            return
        self.resp._got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(ConnectionError(f"malformed response from the upstream: {e}"))
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        r = self.resp
        if r is not None and exc is None and r._headers_done.done() and not r.complete and r.until_close:
            r._finish()  # a body without length or chunks ends where the connection does
            return
        self._fail(ConnectionResetError("the upstream closed the connection") if exc is None else
                   ConnectionResetError(f"the upstream connection was lost: {exc}"))

    def _fail(self, exc: Exception) -> None:
        r = self.resp
        if r is not None and not r.complete:
            r._error(exc)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.resp.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        r = self.resp
        r.status = self.parser.get_status_code()
        r.keep_alive = self.parser.should_keep_alive()
        r.until_close = "content-length" not in r.headers and "chunked" not in r.headers.get("transfer-encoding", "")
        if not r._headers_done.done():
            r._headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.resp._feed(body)

    def on_message_complete(self) -> None:
        self.resp._finish()


class Response:
    """The upstream's answer; `content` is itself (readany, iter_any), as with aiohttp."""

    def __init__(self, conn: _Conn):
        self.conn = conn
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = False
        self.until_close = False
        self.complete = False
        self.content = self
        self._headers_done = asyncio.get_running_loop().create_future()
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future | None = None
        self._exc: Exception | None = None
        self._paused = False
        self._got_bytes = False
        self._slot: asyncio.Semaphore | None = None  # the upstream's connection slot, held until release()

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER and not self._paused:
            self._paused = True
            self.conn.transport.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self.complete = True
        self._wake()

    def _error(self, exc: Exception) -> None:
        self._exc = exc
        if not self._headers_done.done():
            self._headers_done.set_exception(exc)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def readany(self, timeout: float | None = None) -> bytes:
        """The next bytes of the body as they arrived; b"" once it is complete. UpstreamTimeout after
        `timeout` seconds (default: the client's idle-read timeout) without any."""
        while not self._chunks:
            if self.complete:
                return b""
            if self._exc is not None:
                raise self._exc
            self._waiter = waiter = asyncio.get_running_loop().create_future()
            wait = self.conn.pool.idle_read_timeout_s if timeout is None else timeout
            handle = asyncio.get_running_loop().call_later(wait, _expire, waiter)
            try:
                await waiter
            finally:
                handle.cancel()
            if waiter.result() is _EXPIRED and not self._chunks and not self.complete and self._exc is None:
                self.conn.closed = True
                self.conn.transport.close()  # the upstream sees the client leave and aborts the request
                raise UpstreamTimeout(f"the upstream sent nothing for {wait:g} s", first_byte=False)
        data = self._chunks.popleft()
        self._buffered -= len(data)
        if self._paused and self._buffered <= HIGH_WATER // 4:
            self._paused = False
            self.conn.transport.resume_reading()
        return data

    async def iter_any(self):
        while chunk := await self.readany():
            yield chunk

    async def read(self) -> bytes:
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Back to the pool when the answer was read whole and the upstream keeps the connection; else closed
        (a stream the user left is cut off at the upstream this way)."""
        if self._slot is not None:
            self._slot.release()
            self._slot = None
        conn = self.conn
        if conn.resp is not self:
            return  # released already
        conn.resp = None
        if self.complete and self.keep_alive and not conn.closed:
            conn.idle_since = time.monotonic()
            conn.pool._idle.setdefault(conn.key, []).append(conn)
        elif not conn.closed:
            conn.closed = True
            conn.transport.close()


_EXPIRED = object()


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(_EXPIRED)


class UpstreamClient:
    def __init__(self, connect_timeout_s: float, first_byte_timeout_s: float = 600.0,
                 idle_read_timeout_s: float = 300.0, max_connections: int = 1024, auth=None):
        self.connect_timeout_s = connect_timeout_s
        self.first_byte_timeout_s, self.idle_read_timeout_s = first_byte_timeout_s, idle_read_timeout_s
        self.max_connections = max_connections
        self.auth = auth  # UpstreamAuth: the secret each upstream is shown, if any
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._slots: dict[tuple[str, int], asyncio.Semaphore] = {}

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> Response:
        parts = urlsplit(url)
        if parts.scheme != "http":
            raise ConnectionError(f"only http:// upstreams are supported, got {url!r}")
        key = (parts.hostname or "127.0.0.1", parts.port or 80)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = [f"POST {path} HTTP/1.1\r\nhost: {parts.netloc}\r\ncontent-length: {len(body)}\r\n"]
        head.extend(f"{k}: {v}\r\n" for k, v in headers.items())
        auth = self.auth.header(url) if self.auth is not None else None
        if auth is not None:
            head.append(f"authorization: {auth}\r\n")
        request = "".join(head).encode("latin-1") + b"\r\n" + body
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = asyncio.Semaphore(self.max_connections)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await slot.acquire()
        except TimeoutError:
            raise TimeoutError(f"all {self.max_connections} connections to {parts.netloc} stayed busy") from None
        try:
            resp = None
            conn = self._pooled(key)
            if conn is not None:
                try:
                    resp = await self._send(conn, request)
                except _Stale:
                    pass  # the upstream had closed the idle connection: once more on a new one
            if resp is None:
                resp = await self._send(await self._connect(key), request)
        except BaseException:
            slot.release()
            raise
        resp._slot = slot
        return resp

    def _pooled(self, key: tuple[str, int]) -> _Conn | None:
        idle, now = self._idle.get(key), time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < IDLE_S:
                return conn
            if not conn.closed:
                conn.closed = True
                conn.transport.close()
        return None

    async def _connect(self, key: tuple[str, int]) -> _Conn:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, conn = await loop.create_connection(lambda: _Conn(self, key), *key)
        return conn

    async def _send(self, conn: _Conn, request: bytes) -> Response:
        resp = conn.resp = Response(conn)
        reused = conn.idle_since > 0
        conn.parser = httptools.HttpResponseParser(conn)
        conn.transport.write(request)
        try:
            try:
                async with asyncio.timeout(self.first_byte_timeout_s):
                    await resp._headers_done
            except TimeoutError:
                conn.closed = True
                conn.transport.close()  # the upstream sees the client leave and aborts the request
                raise UpstreamTimeout(f"no response from the upstream within {self.first_byte_timeout_s:g} s",
                                      first_byte=True) from None
        except ConnectionResetError as e:
            resp.release()
            if reused and not resp._got_bytes:
                raise _Stale(str(e)) from None
            raise
        except BaseException:
            resp.release()
            raise
        return resp

    async def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                if not conn.closed:
                    conn.closed = True
                    conn.transport.close()
        self._idle.clear()
