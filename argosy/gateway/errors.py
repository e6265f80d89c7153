"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`, plus `Retry-After` when retryable."""

from __future__ import annotations

import json
import math


class GatewayError(Exception):
    def __init__(self, status: int, message: str, type_: str, code: str | None = None,
                 param: str | None = None, retry_after: float | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.retry_after = retry_after
        self.extra_headers = headers or []

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)

    def headers(self) -> list[tuple[bytes, bytes]]:
        h = [(b"content-type", b"application/json")]
        if self.retry_after is not None:
            h.append((b"retry-after", str(max(1, math.ceil(self.retry_after))).encode()))
        return h + self.extra_headers


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, "invalid_request_error", code, param)


def unavailable(message: str, code: str, retry_after: float = 1.0) -> GatewayError:
    return GatewayError(503, message, "service_unavailable", code, retry_after=retry_after)


def rate_limited(message: str, code: str, retry_after: float) -> GatewayError:
    return GatewayError(429, message, "rate_limit_error", code, retry_after=retry_after)


def not_found(message: str) -> GatewayError:
    return GatewayError(404, message, "not_found_error", "not_found")


def method_not_allowed(method: str, path: str, allowed: list[str]) -> GatewayError:
    return GatewayError(405, f"{method} is not allowed on {path} (allowed: {', '.join(allowed)})",
                        "invalid_request_error", "method_not_allowed",
                        headers=[(b"allow", ", ".join(allowed).encode())])


def usd(amount: float) -> str:
    """Dollars as people write them: $12.50, and a small budget's digits in full ($0.00001, not $1e-05)."""
    return f"${amount:,.2f}" if amount >= 1 else "$" + f"{amount:.8f}".rstrip("0").rstrip(".")
