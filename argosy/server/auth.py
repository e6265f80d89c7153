"""`argosy engine --api-key` (or ARGOSY_API_KEY): every route but /health, /ready, /metrics and /version needs
`Authorization: Bearer <key>`; anything else gets 401 in the OpenAI error format.

As in vLLM, health, readiness and metrics stay open (load balancers and Prometheus call them without
credentials; they carry no prompt or output). The fleet gives its replicas a secret this way, so a
process that reaches a replica's port directly cannot skip the gateway's keys, limits and guardrails.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from argosy.server.errors import APIError

API_KEY_ENV = "ARGOSY_API_KEY"
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/version"})


class RequireAPIKey:
    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        # Digests of equal length, compared in constant time: the key's length leaks nothing either.
        self.expected = hashlib.sha256(b"Bearer " + api_key.encode()).digest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        if hmac.compare_digest(hashlib.sha256(given).digest(), self.expected):
            return await self.app(scope, receive, send)
        err = APIError(401, "A valid API key is required (Authorization: Bearer ...).", code="invalid_api_key")
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": err.body()})
