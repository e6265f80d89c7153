"""The gateway's outermost ASGI layer: a request still in flight when the server stops gets an answer.

On SIGTERM or Ctrl-C uvicorn stops accepting connections, gives open requests `timeout_graceful_shutdown`
seconds, then cancels their tasks, and a cancelled task that had not answered yet got a bare 500 (with
a traceback in the log); a stream that had started just stopped. Here a cancelled request gets, instead,
a 503 `gateway_stopping` with Retry-After (nothing sent yet), or, for a stream under way, an SSE error
event and `data: [DONE]`: a clean refusal or a counted cut, never a silent loss.
"""

from __future__ import annotations

import asyncio

from argosy.gateway.errors import unavailable
from argosy.gateway.proxy import stream_error

NOTHING, STARTED, FINISHED = 0, 1, 2


class AnswerOnCancel:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state, sse = NOTHING, False

        async def tracked(message) -> None:
            nonlocal state, sse
            if message["type"] == "http.response.start":
                state = STARTED
                sse = any(k == b"content-type" and v.startswith(b"text/event-stream")
                          for k, v in message.get("headers", ()))
            elif not message.get("more_body"):
                state = FINISHED
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if state == NOTHING:
                err = unavailable("the gateway is stopping; retry in a moment", "gateway_stopping", 1.0)
                body = err.body()
                await send({"type": "http.response.start", "status": err.status,
                            "headers": [*err.headers(), (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
            elif state == STARTED and sse:
                await send({"type": "http.response.body", "more_body": False, "body": stream_error(
                    "the gateway is stopping; the response is incomplete", "gateway_stopping")})
            # A non-streamed body cut halfway cannot be mended: the connection closes.
