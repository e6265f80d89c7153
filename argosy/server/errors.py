"""OpenAI-shaped error responses: `{"error": {"message", "type", "param", "code"}}` with a 4xx/5xx status."""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from argosy.engine.errors import InvalidRequestError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """A request the server answers with an error body; raised anywhere in a handler."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    @classmethod
    def bad_request(cls, message: str, param: str | None = None, code: str | None = None) -> APIError:
        return cls(400, message, param=param, code=code)

    @classmethod
    def from_invalid(cls, exc: InvalidRequestError) -> APIError:
        return cls(400, str(exc), param=exc.param)

    @classmethod
    def overloaded(cls, message: str, retry_after_s: int = 1) -> APIError:
        return cls(503, message, code="overloaded", headers={"Retry-After": str(retry_after_s)})

    def body(self) -> bytes:
        error = {
            "message": self.message,
            "type": _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error"),
            "param": self.param,
            "code": self.code,
        }
        return json.dumps({"error": error}, separators=(",", ":")).encode()

    def response(self) -> Response:
        return Response(self.body(), status_code=self.status, headers=self.headers, media_type="application/json")


async def api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response()


async def http_error_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (unknown route, wrong method) in the OpenAI error shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message, code = f"Route {request.method} {request.url.path} not found.", "not_found"
    elif exc.status_code == 405:
        message, code = f"Method {request.method} not allowed on {request.url.path}.", "method_not_allowed"
    else:
        message, code = str(exc.detail), None
    return APIError(exc.status_code, message, code=code, headers=exc.headers).response()


async def server_error_handler(request: Request, exc: Exception) -> Response:
    # The message names the exception class only: its text could quote a prompt.
    return APIError(500, f"Internal server error ({type(exc).__name__}).", code="internal_error").response()
