"""The hand-written nasty cases of the fuzz runs (issue 15), sent as raw bytes over a socket so that
nothing in between tidies them: wrong types in every field, huge and negative numbers, NaN and
Infinity, deep nesting, duplicate keys, invalid UTF-8 and lone surrogates, token ids outside the
vocabulary, 10,000 stop strings, n of 10,000, junk logit_bias, empty and 100 MB bodies, and headers
missing, doubled or contradicting each other. A case passes when the answer is a status below 500
(or the server closes a connection it cannot parse, having answered 4xx or nothing), within a timeout.
"""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

WRONG = ["text", 12345, -1.5, True, [], {}, [1, "a"], {"a": {"b": []}}, None]
HUGE = ["1e308", "-1e308", str(2**63), str(2**64), str(-2**63 - 1), "1" + "0" * 400, "-1", "0", "1e-320", "-0"]
CONSTANTS = ["NaN", "Infinity", "-Infinity"]
NUMERIC = ["n", "best_of", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
           "repetition_penalty", "max_tokens", "min_tokens", "logprobs", "priority", "top_logprobs",
           "max_completion_tokens"]


@dataclass
class Case:
    name: str
    path: str
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)
    raw_head: bytes | None = None  # the whole request head as given (headers cases)


def base(path: str, model: str) -> dict:
    if path == "/v1/chat/completions":
        return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    return {"model": model, "prompt": "hello", "max_tokens": 4}


def with_raw(path: str, model: str, key: str, raw: str) -> bytes:
    """The base body with one field's value written as raw JSON text (NaN, 1e400, ...)."""
    body = json.dumps({k: v for k, v in base(path, model).items() if k != key})
    return (body[:-1] + f', "{key}": {raw}}}').encode()


def cases(model: str, vocab: int = 512) -> Iterator[Case]:
    for path in ("/v1/completions", "/v1/chat/completions"):
        fields = set(base(path, model)) | set(NUMERIC) | {
            "stop", "stop_token_ids", "stream", "stream_options", "logit_bias", "user", "cache_salt", "echo",
            "ignore_eos", "response_format", "tools", "suffix", "logprobs", "skip_special_tokens"}
        for f in sorted(fields):
            for v in WRONG:
                yield Case(f"wrong type {f}={json.dumps(v)}", path, with_raw(path, model, f, json.dumps(v)))
        for f in NUMERIC:
            for raw in HUGE + CONSTANTS:
                yield Case(f"number {f}={raw[:20]}", path, with_raw(path, model, f, raw))
        b = base(path, model)
        key = "messages" if "messages" in b else "prompt"
        for depth in (100, 10_000, 200_000):
            yield Case(f"nested {depth} deep", path, with_raw(path, model, key, "[" * depth + "]" * depth))
        yield Case("nested objects", path, with_raw(path, model, key, '{"a":' * 5000 + "1" + "}" * 5000))
        yield Case("duplicate model", path, json.dumps(b).encode()[:-1] + b', "model": "other"}')
        yield Case("duplicate max_tokens", path, json.dumps(b).encode()[:-1] + b', "max_tokens": -1}')
        yield Case("invalid UTF-8", path, json.dumps(b).encode().replace(b"hello", b"he\xff\xfe\xc0\xafllo"))
        yield Case("lone surrogate", path, json.dumps(b).encode().replace(b"hello", b"he\\ud800llo"))
        yield Case("NUL bytes", path, json.dumps(b).encode().replace(b"hello", b"he\\u0000llo"))
        yield Case("10,000 stop strings", path, json.dumps({**b, "stop": [f"s{i}" for i in range(10_000)]}).encode())
        yield Case("10,000 stop ids", path, json.dumps({**b, "stop_token_ids": list(range(10_000))}).encode())
        yield Case("a 1 MB stop string", path, json.dumps({**b, "stop": "x" * 1_000_000}).encode())
        yield Case("n of 10,000", path, json.dumps({**b, "n": 10_000}).encode())
        for junk in ({"x": "y"}, {"1": 1e308}, [1, 2], "str", {"99999999": 100}, {"-1": -100}):
            yield Case(f"logit_bias {json.dumps(junk)[:20]}", path, json.dumps({**b, "logit_bias": junk}).encode())
        for body, name in ((b"", "empty body"), (b"null", "null"), (b"[]", "a list"), (b'"x"', "a string"),
                           (b"{", "cut JSON"), (b"{}", "no fields")):
            yield Case(name, path, body)
        yield Case("10 MB prompt", path, json.dumps({**b, key: "x " * 5_000_000 if key == "prompt"
                                                    else [{"role": "user", "content": "x " * 5_000_000}]}).encode())
    p = "/v1/completions"
    for ids in ([vocab], [vocab + 1, 1], [2**31], [-1], [10**30], [1] * 100_000, [[vocab]], [[]], []):
        yield Case(f"token ids {json.dumps(ids)[:24]}", p, json.dumps({**base(p, model), "prompt": ids}).encode())
    yield Case("100 MB body", p, b'{"model": "x", "prompt": "' + b"x" * (100 * 1024 * 1024) + b'"}')
    yield from header_cases(model)


def header_cases(model: str) -> Iterator[Case]:
    body = json.dumps(base("/v1/completions", model)).encode()
    n = str(len(body))
    heads = {
        "no content-type": [("content-length", n)],
        "text/plain content-type": [("content-type", "text/plain"), ("content-length", n)],
        "doubled content-type": [("content-type", "application/json"), ("content-type", "text/html"),
                                 ("content-length", n)],
        "doubled content-length, same": [("content-type", "application/json"), ("content-length", n),
                                         ("content-length", n)],
        "doubled content-length, different": [("content-type", "application/json"), ("content-length", n),
                                              ("content-length", "5")],
        "content-length and chunked": [("content-type", "application/json"), ("content-length", n),
                                       ("transfer-encoding", "chunked")],
        "no content-length": [("content-type", "application/json")],
        "negative content-length": [("content-length", "-5")],
        "huge content-length": [("content-length", str(10**20))],
        "doubled authorization": [("authorization", "Bearer a"), ("authorization", "Bearer b"),
                                  ("content-length", n)],
        "doubled x-request-id": [("x-request-id", "a"), ("x-request-id", "b"), ("content-length", n)],
        "doubled x-priority": [("x-priority", "batch"), ("x-priority", "interactive"), ("content-length", n)],
        "huge header": [("x-junk", "x" * 100_000), ("content-length", n)],
        "10,000 headers": [(f"x-h{i}", "v") for i in range(10_000)] + [("content-length", n)],
        "bad traceparent": [("traceparent", "00-zz-zz-01"), ("content-length", n)],
    }
    for name, hs in heads.items():
        yield Case(f"header: {name}", "/v1/completions", body, raw_head=_head("/v1/completions", hs, host=True))
    yield Case("header: no host", "/v1/completions", body,
               raw_head=_head("/v1/completions", [("content-length", n)], host=False))


def _head(path: str, headers: list[tuple[str, str]], host: bool) -> bytes:
    lines = [f"POST {path} HTTP/1.1"] + (["host: 127.0.0.1"] if host else []) + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def send(url: str, case: Case, auth: str | None, timeout: float = 60.0) -> str:
    """The answer's status as text ('413'), or 'closed' (no answer, connection closed), or 'timeout'."""
    u = urlsplit(url)
    head = case.raw_head
    if head is None:
        hs = [("content-type", "application/json"), ("content-length", str(len(case.body)))]
        hs += [("authorization", f"Bearer {auth}")] if auth else []
        head = _head(case.path, hs, host=True)
    elif auth and b"authorization" not in head:
        head = head[:-2] + f"authorization: Bearer {auth}\r\n\r\n".encode()
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((u.hostname, u.port), timeout=timeout) as s:
            try:
                s.sendall(head + case.body)
            except OSError:
                pass  # answered and closed while we sent (a 413 for a body over the cap)
            data = b""
            while b"\r\n" not in data and time.monotonic() < deadline:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except TimeoutError:
        return "timeout"
    except OSError:
        return "closed"
    if not data.startswith(b"HTTP/1.1 "):
        return "closed" if not data else "garbage"
    return data.split(b" ", 2)[1].decode()


def run_cases(url: str, model: str, auth: str | None = None, vocab: int = 512) -> tuple[Counter, list[str]]:
    """Sends every case; (answers by status, the failures: a status >= 500, a timeout, garbage)."""
    seen, bad = Counter(), []
    for case in cases(model, vocab):
        answer = send(url, case, auth)
        seen[answer] += 1
        if answer in ("timeout", "garbage") or answer.isdigit() and int(answer) >= 500:
            bad.append(f"{case.name} ({case.path}): {answer}")
    return seen, bad
