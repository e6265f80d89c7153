"""The ASGI plumbing every gateway endpoint shares: headers, the bearer token, the body, a response.

A leaf: it imports nothing from Argosy, so any endpoint module can use it without reaching up to the app.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
JSON = b"application/json"
PROMETHEUS_TEXT = b"text/plain; version=0.0.4"


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of a request header (`name` in lower case, as ASGI gives them)."""
    for k, v in scope["headers"]:
        if k == name:
            return v
    return None


def bearer(scope: Scope) -> str | None:
    """The token of `Authorization: Bearer <token>`, or None."""
    v = header(scope, b"authorization")
    if v and v[:7].lower() == b"bearer ":
        return v[7:].strip().decode(errors="replace")
    return None


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        m = await receive()
        chunks.append(m.get("body", b""))
        if not m.get("more_body"):
            return b"".join(chunks)


async def client_gone(receive: Receive) -> None:
    """Returns when the client has disconnected; call it once the body has been read whole (ASGI then has
    nothing more to give but `http.disconnect`)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def respond(send: Send, status: int, body: bytes, ctype: bytes = JSON,
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    h = headers or [(b"content-type", ctype)]
    await send({"type": "http.response.start", "status": status,
                "headers": [*h, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def respond_json(send: Send, status: int, obj: Any) -> None:
    await respond(send, status, json.dumps(obj).encode())
