"""The gateway's HTTP protocol: uvicorn's httptools one, with a deadline on each request head.

uvicorn times out a kept-alive connection only after a response; a connection that sends nothing, or
sends its request head a byte at a time (slow loris), holds its socket for ever, and enough of them
use up the file descriptors. Here a request head must be complete within `request_header_timeout_s`
of the connection opening (or of its previous response ending), else the connection is closed, as
nginx's client_header_timeout does (60 s there; 30 s here by default). Its body, once the head is in, may
not stall that long either (between two reads, as nginx's client_body_timeout): a client that sent a head
and a Content-Length and then nothing (slow POST) held its socket for ever too; it gets a 408, as from nginx.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def _request_timeout(timeout_s: float) -> bytes:
    body = json.dumps({"error": {"message": f"the request body stalled: nothing came for {timeout_s:g} s",
                                 "type": "invalid_request_error", "param": None, "code": "request_timeout"}}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body))


def guarded_protocol(header_timeout_s: float) -> type[HttpToolsProtocol]:
    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _head_deadline: asyncio.TimerHandle | None = None
        _body_deadline: asyncio.TimerHandle | None = None
        _body_seen = 0.0  # loop time of the body's last bytes

        def _arm(self) -> None:
            if self._head_deadline is None:
                self._head_deadline = self.loop.call_later(header_timeout_s, self._head_too_slow)

        def _disarm(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        def _head_too_slow(self) -> None:
            self._head_deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def _arm_body(self) -> None:
            self._body_seen = self.loop.time()
            if self._body_deadline is None:
                self._body_deadline = self.loop.call_later(header_timeout_s, self._body_too_slow)

        def _disarm_body(self) -> None:
            if self._body_deadline is not None:
                self._body_deadline.cancel()
                self._body_deadline = None

        def _body_too_slow(self) -> None:
            self._body_deadline = None
            if self.flow.read_paused:  # the app has not read what came yet: not the client's stall
                self._body_seen = self.loop.time()
            wait = self._body_seen + header_timeout_s - self.loop.time()
            if wait > 0:  # bytes came meanwhile
                self._body_deadline = self.loop.call_later(wait, self._body_too_slow)
            elif not self.transport.is_closing():
                cycle = getattr(self, "cycle", None)
                if cycle is not None and not cycle.response_started:  # nginx's client_body_timeout: a 408
                    self.transport.write(_request_timeout(header_timeout_s))
                self.transport.close()  # the app's receive() then sees the disconnect, and answers nothing

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            self._disarm_body()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()  # a kept-alive connection's next request: its head is due in time too

        def on_headers_complete(self) -> None:
            self._disarm()
            self._arm_body()  # a request without a body completes at once, in the same read
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            self._body_seen = self.loop.time()
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._disarm_body()
            super().on_message_complete()

    return GuardedHttpToolsProtocol
