"""The gateway's HTTP protocol: uvicorn's httptools one, with a deadline on each request head.

uvicorn times out a kept-alive connection only after a response; a connection that sends nothing, or
sends its request head a byte at a time (slow loris), holds its socket for ever, and enough of them
use up the file descriptors. Here a request head must be complete within `request_header_timeout_s`
of the connection opening (or of its previous response ending), else the connection is closed, as
nginx's client_header_timeout does (60 s there; 30 s here by default).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def guarded_protocol(header_timeout_s: float) -> type[HttpToolsProtocol]:
    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _head_deadline: asyncio.TimerHandle | None = None

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

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()  # a kept-alive connection's next request: its head is due in time too

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

    return GuardedHttpToolsProtocol
