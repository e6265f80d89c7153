"""Who is calling: the request's API key checked against the KeyStore, failed attempts limited per address.

Each client address has a bucket of `auth_failures_per_minute` failed authentications (a key that is
presented and wrong), refilled at that rate. An address whose bucket is empty gets 429 with Retry-After
for any key not verified before, without checking it: guessing keys costs the guesser, not the gateway.
A key verified before is one dict lookup and is never refused this way, so a flood from a shared
address does not lock out the clients that already authenticated. A request with no key at all is a
401 and is not counted (a misconfigured client sees why it fails).
"""

from __future__ import annotations

import time
from collections import OrderedDict

from argosy.gateway.errors import GatewayError, rate_limited
from argosy.gateway.keys import KeyRecord, KeyStore

MAX_ADDRESSES = 65_536  # buckets remembered (LRU); a forgotten address starts with a full bucket


def bearer(scope) -> str | None:
    for k, v in scope["headers"]:
        if k == b"authorization":
            if v[:7].lower() == b"bearer ":
                return v[7:].strip().decode(errors="replace")
            return None
    return None


def client_address(scope) -> str:
    client = scope.get("client")
    return client[0] if client else "unknown"


class FailedAuthLimiter:
    def __init__(self, per_minute: int):
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, at)

    def _level(self, addr: str, now: float) -> float:
        tokens, at = self.buckets.get(addr, (self.capacity, now))
        return min(self.capacity, tokens + (now - at) * self.rate)

    def retry_after(self, addr: str) -> float:
        """Seconds until this address may fail again; 0 when it may now."""
        now = time.monotonic()
        level = self._level(addr, now)
        return 0.0 if level >= 1 else (1 - level) / self.rate

    def failed(self, addr: str) -> None:
        now = time.monotonic()
        self.buckets[addr] = (max(0.0, self._level(addr, now) - 1), now)
        self.buckets.move_to_end(addr)
        if len(self.buckets) > MAX_ADDRESSES:
            self.buckets.popitem(last=False)


class Authenticator:
    def __init__(self, keys: KeyStore, failures_per_minute: int):
        self.keys = keys
        self.limiter = FailedAuthLimiter(failures_per_minute)

    def _check_address(self, scope) -> str:
        addr = client_address(scope)
        wait = self.limiter.retry_after(addr)
        if wait > 0:
            raise rate_limited("too many failed authentications from this address; retry later",
                               "too_many_auth_failures", wait)
        return addr

    async def request_key(self, scope) -> KeyRecord | None:
        """The caller's key record; None when the gateway has no keys. Raises 401 or 429."""
        if self.keys.keyless:
            return None  # no keys configured: loopback only (checked at startup), no key needed
        key = bearer(scope)
        if not key:
            raise GatewayError(401, "a valid API key is required (Authorization: Bearer sk-argosy-...)",
                               "authentication_error", "invalid_api_key")
        rec = self.keys.cached(key)
        if rec is not None:
            return rec
        addr = self._check_address(scope)
        rec = await self.keys.lookup(key)
        if rec is None:
            self.limiter.failed(addr)
            raise GatewayError(401, "a valid API key is required (Authorization: Bearer sk-argosy-...)",
                               "authentication_error", "invalid_api_key")
        return rec

    async def is_admin(self, scope) -> bool:
        key = bearer(scope)
        if not key:
            return False
        if self.keys.admin_cached(key):
            return True
        addr = self._check_address(scope)
        if await self.keys.is_admin(key):
            return True
        self.limiter.failed(addr)
        return False
