"""What the gateway accepts from a caller: the request body, counted while it is read.

A body over `gateway.max_body_bytes` (8 MiB by default, the engine's cap too) is refused with 413 as
soon as its Content-Length says so, or once the bytes read pass the cap (a chunked body has no
length): the gateway never holds more than the cap of one request in memory.
"""

from __future__ import annotations

import json
from typing import Any

from argosy.gateway.errors import GatewayError
from argosy.server.protocol import finite_float, has_lone_surrogate


def too_large(limit: int) -> GatewayError:
    return GatewayError(413, f"the request body is over the gateway's limit of {limit} bytes",
                        "invalid_request_error", "request_too_large")


async def read_body(scope, receive, limit: int) -> bytes:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                if int(value) > limit:
                    raise too_large(limit)
            except ValueError:
                raise GatewayError(400, "the Content-Length header is not a number", "invalid_request_error",
                                   "bad_content_length") from None
    chunks, size = [], 0
    while True:
        m = await receive()
        if m["type"] == "http.disconnect":
            raise GatewayError(400, "the client closed the connection before sending its body",
                               "invalid_request_error", "client_disconnected")
        chunk = m.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
        if not m.get("more_body"):
            return b"".join(chunks)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")  # NaN, Infinity: not JSON (RFC 8259)


def parse_json(body: bytes, what: str = "the body") -> Any:
    """Strict JSON: 400 for invalid UTF-8 or JSON, NaN or Infinity, or nesting deeper than the parser goes."""
    try:
        value = json.loads(body, parse_constant=_no_constant, parse_float=finite_float)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        why = "nested too deeply" if isinstance(e, RecursionError) else f"not valid JSON ({e})"
        raise GatewayError(400, f"{what} is {why}", "invalid_request_error", "invalid_json") from None
    if b"\\ud" in body.lower() and has_lone_surrogate(value):  # text no tokenizer (or prefix hash) can encode
        raise GatewayError(400, f"{what} has a lone UTF-16 surrogate in a string", "invalid_request_error",
                           "invalid_json")
    return value
