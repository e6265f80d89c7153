"""Server-sent events and client-disconnect handling.

A client that goes away must stop its generation at once, so both the streaming response and the
non-streaming handlers run under `cancel_on_disconnect`: a watcher task reads the ASGI `receive`
channel and cancels the handler's task on `http.disconnect`; the handler's `finally` aborts the
engine requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

DONE = b"data: [DONE]\n\n"
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # proxies must not buffer the stream
]


RAW_SEND = "argosy.raw_send"  # scope key: the ASGI server's own `send`, set by KeepRawSend


class ClientDisconnected(Exception):
    pass


class KeepRawSend:
    """The outermost ASGI layer: remembers the server's `send` in the scope for SSEResponse."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[RAW_SEND] = send
        await self.app(scope, receive, send)


@asynccontextmanager
async def cancel_on_disconnect(receive: Receive) -> AsyncIterator[None]:
    """Runs the body; raises ClientDisconnected (instead of finishing it) if the client goes away."""
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone = True
                task.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        yield
    except asyncio.CancelledError:
        if gone and task.uncancel() == 0:
            raise ClientDisconnected() from None
        raise
    finally:
        watcher.cancel()


class SSEResponse:
    """An ASGI response streaming the byte chunks of `events`; `on_close` runs however it ends."""

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]):
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Chunks go straight to the server's send (see RAW_SEND): per token, Starlette's wrappers
        # would only re-check that the response has started. The start goes through them.
        send_chunk = scope.get(RAW_SEND, send)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            async with cancel_on_disconnect(receive):
                async for chunk in self._events:
                    await send_chunk({"type": "http.response.body", "body": chunk, "more_body": True})
        except ClientDisconnected:
            return
        finally:
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()
            self._on_close()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def wait_for_finals(state, request, group) -> list | Response:
    """A non-streaming request's final outputs; a client that hangs up first aborts it (499)."""
    from argosy.server.async_engine import EngineStepError
    from argosy.server.errors import APIError

    try:
        async with cancel_on_disconnect(request.receive):
            return await group.wait_finished()
    except ClientDisconnected:
        return Response(status_code=499)
    except EngineStepError as exc:
        raise APIError(500, str(exc), code="engine_error") from None
    finally:
        state.engine.abort(group)  # a no-op once every request finished
