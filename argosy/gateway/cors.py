"""CORS for browser apps that call the gateway with an API key (`gateway.cors_allow_origins`; vLLM's
--allowed-origins). Off by default: with no origins listed a preflight is a 405 and answers carry no
Access-Control-* header, so a browser lets no other page read them.

A listed origin (or "*", any) gets its preflight answered (204, the methods and the headers it asked for) and
its answers the Access-Control-Allow-Origin header naming it (with Vary: Origin, so caches keep pages apart).
No cookies are involved (the key is a header), so no Allow-Credentials. A keyless gateway still refuses web
pages on its model and admin routes whatever is listed (app.Gateway.authenticate).
"""

from __future__ import annotations

from argosy.gateway.asgi import Scope, Send, header

METHODS = b"GET, POST, DELETE"
EXPOSED = b"x-request-id, retry-after, x-argosy-region"
MAX_AGE_S = b"600"


class Cors:
    def __init__(self, origins: list[str]):
        self.any = "*" in origins
        self.origins = frozenset(o.encode() for o in origins)

    def allowed(self, scope: Scope) -> bytes | None:
        """The request's Origin when answers to it may be read by that page, else None."""
        if not self.origins:
            return None
        origin = header(scope, b"origin")
        return origin if origin is not None and (self.any or origin in self.origins) else None

    async def preflight(self, scope: Scope, origin: bytes, send: Send) -> None:
        asked = header(scope, b"access-control-request-headers") or b""
        await send({"type": "http.response.start", "status": 204, "headers": [
            (b"access-control-allow-origin", origin), (b"vary", b"Origin"),
            (b"access-control-allow-methods", METHODS), (b"access-control-allow-headers", asked),
            (b"access-control-max-age", MAX_AGE_S), (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    @staticmethod
    def readable(send: Send, origin: bytes) -> Send:
        """`send` with the headers that let the page read the answer added to its start."""
        async def with_cors(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"access-control-allow-origin", origin),
                                                  (b"vary", b"Origin"), (b"access-control-expose-headers", EXPOSED)]}
            await send(message)

        return with_cors


def is_preflight(scope: Scope) -> bool:
    return scope["method"] == "OPTIONS" and header(scope, b"access-control-request-method") is not None

