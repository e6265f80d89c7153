"""The secret the gateway shows its upstreams (`Authorization: Bearer ...`), by upstream origin.

`argosy serve` makes one secret per fleet at start, gives it to each replica it starts through the
environment (ARGOSY_API_KEY, never argv) and registers each replica's URL here; a standalone gateway
in front of `argosy engine --api-key` replicas reads ARGOSY_UPSTREAM_API_KEY and shows it to every
upstream of its fleet file (and those added through /admin/upstreams). The header goes on every call to
an upstream: proxied requests, health checks, scrapes, readiness probes and shadow requests, and on
nothing else (a guardrail's moderation service never sees it).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Container
from urllib.parse import urlsplit

UPSTREAM_KEY_ENV = "ARGOSY_UPSTREAM_API_KEY"


def origin(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}"


class UpstreamAuth:
    def __init__(self, known_upstreams: Container[str] = (), default: str | None = None):
        self.default = default if default is not None else os.environ.get(UPSTREAM_KEY_ENV) or None
        self.known = known_upstreams  # the registry's upstream URLs: the default secret goes to those only
        self.by_origin: dict[str, str] = {}
        self._fleet_secret: str | None = None

    def fleet_secret(self) -> str:
        """This fleet's replica secret, made on first use (one per `argosy serve` run)."""
        if self._fleet_secret is None:
            self._fleet_secret = secrets.token_urlsafe(32)
        return self._fleet_secret

    def register(self, url: str, secret: str) -> None:
        self.by_origin[origin(url)] = secret

    def forget(self, url: str) -> None:
        self.by_origin.pop(origin(url), None)

    def header(self, url: str) -> str | None:
        """`Bearer <secret>` for a URL on an upstream that has one, else None."""
        o = origin(url)
        secret = self.by_origin.get(o)
        if secret is None and self.default is not None and (
                o in self.known or any(str(u).startswith(o + "/") for u in self._iter_known())):
            secret = self.default
        return f"Bearer {secret}" if secret is not None else None

    def _iter_known(self):
        return iter(self.known) if hasattr(self.known, "__iter__") else ()

    def middleware(self) -> Callable:
        """An aiohttp client middleware that adds the header to the calls of the gateway's shared session."""
        async def add_upstream_auth(request, handler):
            value = self.header(str(request.url))
            if value is not None and "Authorization" not in request.headers:
                request.headers["Authorization"] = value
            return await handler(request)
        return add_upstream_auth
