"""Gateway-to-gateway calls are signed with the regions' shared secret (HMAC-SHA256); nothing between
regions is open.

A signed call carries x-argosy-region (the sender), -ts (Unix time), -nonce and -sig: the HMAC of those,
the method and path, the forwarded request's own headers (origin, residency, key) and the body's
SHA-256. A call older or newer than max_clock_skew_s, or whose nonce was seen in that window, is refused
(no replays). Answers to state exchanges are signed the same way (method ANSWER), so neither side trusts
a state it cannot check.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from argosy.gateway.errors import GatewayError

SIGNED = ("x-argosy-forwarded-from", "x-argosy-residency", "x-argosy-key")  # forwarded request headers
MIN_SECRET_BYTES = 16
MAX_NONCES = 200_000


class SecretError(ValueError):
    """No usable shared secret: the message says where one goes."""


def load_secret(env: str, path: str | None) -> bytes:
    if path:
        try:
            raw = Path(path).read_text().strip()
        except OSError as e:
            raise SecretError(f"region_routing.secret_file {path}: {e.strerror or e}") from None
    else:
        raw = os.environ.get(env, "").strip()
    if len(raw.encode()) < MIN_SECRET_BYTES:
        raise SecretError(f"regions need a shared secret of at least {MIN_SECRET_BYTES} bytes to sign gateway-to-"
                          f"gateway calls: set ${env} (the same on every region's gateway) or region_routing."
                          "secret_file, e.g. $(python -c 'import secrets; print(secrets.token_hex(32))')")
    return raw.encode()


def _unauthorized(why: str) -> GatewayError:
    return GatewayError(401, f"gateway-to-gateway call refused: {why}", "authentication_error", "region_auth_failed")


class RegionSigner:
    def __init__(self, region: str, secret: bytes, max_skew_s: float, clock=time.time):
        self.region, self.secret, self.skew, self.clock = region, secret, max_skew_s, clock
        self.seen: OrderedDict[str, float] = OrderedDict()  # nonce -> when it stops mattering

    def _mac(self, sender: str, ts: str, nonce: str, method: str, path: str, fields: Mapping[str, str],
             body: bytes) -> str:
        msg = "\n".join([sender, ts, nonce, method, path, *(f"{k}={fields.get(k, '')}" for k in SIGNED),
                         hashlib.sha256(body).hexdigest()])
        return hmac.new(self.secret, msg.encode(), hashlib.sha256).hexdigest()

    def sign(self, method: str, path: str, body: bytes, fields: Mapping[str, str] | None = None) -> dict[str, str]:
        fields = dict(fields or {})
        ts, nonce = f"{self.clock():.3f}", secrets.token_hex(12)
        return {**fields, "x-argosy-region": self.region, "x-argosy-region-ts": ts, "x-argosy-region-nonce": nonce,
                "x-argosy-region-sig": self._mac(self.region, ts, nonce, method, path, fields, body)}

    def verify(self, headers: Mapping[str, str], method: str, path: str, body: bytes) -> str:
        """The sending region, or a 401 GatewayError."""
        sender, ts, nonce, sig = (headers.get(k) for k in ("x-argosy-region", "x-argosy-region-ts",
                                                            "x-argosy-region-nonce", "x-argosy-region-sig"))
        if not (sender and ts and nonce and sig):
            raise _unauthorized("a signed call needs x-argosy-region, -ts, -nonce and -sig")
        try:
            when = float(ts)
        except ValueError:
            raise _unauthorized("x-argosy-region-ts is not a time") from None
        now = self.clock()
        if abs(now - when) > self.skew:
            raise _unauthorized(f"signed {now - when:+.0f} s from now (clocks more than {self.skew:g} s apart, "
                                "or a replay)")
        want = self._mac(sender, ts, nonce, method, path, headers, body)
        if not hmac.compare_digest(want, sig):
            raise _unauthorized("bad signature (a different region secret?)")
        self._forget_old(now)
        if nonce in self.seen:
            raise _unauthorized("this call was seen before (a replay)")
        self.seen[nonce] = now + 2 * self.skew
        return sender

    def _forget_old(self, now: float) -> None:
        while self.seen and (len(self.seen) > MAX_NONCES or next(iter(self.seen.values())) < now):
            self.seen.popitem(last=False)
