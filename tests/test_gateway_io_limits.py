"""What comes in and how long things wait (issue 15 item 5): the body cap (413, counted while reading),
first-byte and idle-read timeouts on proxied calls, and the bound on connections to an upstream."""

from __future__ import annotations

import concurrent.futures as cf
import json
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.fake_upstreams import FakeUpstream
from tests.gateway_fixtures import start_gateway

pytestmark = pytest.mark.timeout(120)
BODY = {"model": "m", "prompt": "hello", "max_tokens": 4}
FAST = {"first_byte_timeout_s": 1.5, "idle_read_timeout_s": 1.0, "max_retries": 0, "health_interval_s": 30}


def gateway_for(up: FakeUpstream, **gw):
    return start_gateway({"gateway": {**FAST, **gw}, "models": [{"name": "m", "upstreams": [up.url]}]})


def raw_chunked_post(url: str, chunks: int, chunk: bytes) -> bytes:
    """POST a chunked body (no Content-Length) without ever ending it; returns what the server answered."""
    p = urlsplit(url)
    with socket.create_connection((p.hostname, p.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"transfer-encoding: chunked\r\n\r\n")
        try:
            for _ in range(chunks):
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass  # the gateway answered and closed while we were still sending
        return s.recv(65536)


def test_request_bodies_are_capped_while_read():
    up = FakeUpstream("ok")
    gw = gateway_for(up, max_body_bytes=64 * 1024)
    try:
        r = httpx.post(gw.url + "/v1/completions", json={**BODY, "prompt": "x" * 70_000}, timeout=30)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert r.json()["error"]["type"] == "invalid_request_error"
        # No Content-Length and a body that never ends: refused once the cap is passed, not at the end.
        answer = raw_chunked_post(gw.url, 200, b"y" * 1024)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert httpx.post(gw.url + "/v1/completions", json=BODY, timeout=30).status_code == 200
        assert up.requests == 1  # nothing over the cap reached the upstream
    finally:
        gw.stop()
        up.stop()


def test_an_upstream_that_never_answers_gets_a_504():
    up = FakeUpstream("silent")
    gw = gateway_for(up)
    try:
        t0 = time.monotonic()
        r = httpx.post(gw.url + "/v1/completions", json=BODY, timeout=30)
        assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
        assert int(r.headers["retry-after"]) >= 1 and 1.4 < time.monotonic() - t0 < 15
        t0 = time.monotonic()
        r = httpx.post(gw.url + "/v1/completions", json={**BODY, "stream": True}, timeout=30)
        assert r.status_code == 504 and time.monotonic() - t0 < 15  # nothing had been sent: still a status
    finally:
        gw.stop()
        up.stop()


def test_a_stream_that_goes_silent_ends_with_an_error_event_then_done():
    up = FakeUpstream("stall_stream")
    gw = gateway_for(up)
    try:
        t0 = time.monotonic()
        r = httpx.post(gw.url + "/v1/completions", json={**BODY, "stream": True}, timeout=30)
        events = [e for e in r.text.split("\n\n") if e.strip()]
        assert r.status_code == 200 and events[-1] == "data: [DONE]" and time.monotonic() - t0 < 15
        assert '"code": "upstream_timeout"' in events[-2] and events[0].startswith("data: {")
    finally:
        gw.stop()
        up.stop()


def test_a_body_that_stalls_or_trickles_gets_a_504():
    for behaviour in ("stall_body", "trickle"):
        up = FakeUpstream(behaviour)
        gw = gateway_for(up)
        try:
            t0 = time.monotonic()
            r = httpx.post(gw.url + "/v1/completions", json=BODY, timeout=30)
            assert r.status_code == 504 and time.monotonic() - t0 < 15, (behaviour, r.status_code)
        finally:
            gw.stop()
            up.stop()


def test_connections_to_an_upstream_are_bounded():
    up = FakeUpstream("ok", delay=0.4)
    gw = gateway_for(up, max_upstream_connections=2, first_byte_timeout_s=30)
    try:
        with cf.ThreadPoolExecutor(6) as ex:
            codes = list(ex.map(lambda _: httpx.post(gw.url + "/v1/completions", json=BODY, timeout=30).status_code,
                                range(6)))
        assert codes == [200] * 6  # the others waited for a connection
        assert up.max_open <= 2 + 1, up.max_open  # two for requests (+ the health check's own)
    finally:
        gw.stop()
        up.stop()


def test_an_idle_kept_alive_connection_outlives_common_client_pools():
    """uvicorn closes an idle kept-alive connection at 5 s, the idle expiry of httpx's pool (and so of the
    openai client's): a request sent on it just then failed with the server never having read it (a bench
    client saw ServerDisconnectedError). The gateway keeps it until a new request head would be too slow."""
    up = FakeUpstream("ok")
    gw = gateway_for(up, request_header_timeout_s=8.0)
    p = urlsplit(gw.url)
    body = json.dumps(BODY).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
               b"content-length: %d\r\n\r\n%s" % (len(body), body))

    def answer(s: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            piece = s.recv(65536)
            if not piece:
                raise ConnectionError("the gateway closed the kept-alive connection")
            data += piece
        head, rest = data.split(b"\r\n\r\n", 1)
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        while len(rest) < length:
            rest += s.recv(65536)
        return head

    try:
        with socket.create_connection((p.hostname, p.port), timeout=20) as s:
            s.sendall(request)
            assert answer(s).startswith(b"HTTP/1.1 200")
            time.sleep(6.0)  # past uvicorn's 5 s
            s.sendall(request)
            assert answer(s).startswith(b"HTTP/1.1 200")
            t0 = time.monotonic()
            assert s.recv(65536) == b""  # and closed once idle past request_header_timeout_s
            assert 6 < time.monotonic() - t0 < 12
    finally:
        gw.stop()
        up.stop()


def test_a_client_body_that_stalls_is_cut_off():
    """A head complete in time, then a body that stops (slow POST): the connection was held for ever, as a
    slow-loris head was before request_header_timeout_s. Its body may not stall that long between reads
    either; one that keeps trickling in is read to its end."""
    up = FakeUpstream("ok")
    gw = gateway_for(up, request_header_timeout_s=1.0)
    p = urlsplit(gw.url)
    body = json.dumps(BODY).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    try:
        with socket.create_connection((p.hostname, p.port), timeout=10) as s:
            s.sendall(head % (len(body) + 100) + body)  # 100 bytes short, never sent
            t0 = time.monotonic()
            answer = b""
            while chunk := s.recv(65536):  # answered 408 (as nginx), then closed by the gateway
                answer += chunk
            assert 0.9 < time.monotonic() - t0 < 5
            head_part, _, error = answer.partition(b"\r\n\r\n")
            assert head_part.startswith(b"HTTP/1.1 408 ") and json.loads(error)["error"]["code"] == "request_timeout"
        with socket.create_connection((p.hostname, p.port), timeout=10) as s:
            s.sendall(head % len(body))
            for i in range(0, len(body), 16):  # 0.6 s between pieces, longer than the timeout in all
                time.sleep(0.6)
                s.sendall(body[i:i + 16])
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
        assert httpx.post(gw.url + "/v1/completions", json=BODY, timeout=30).status_code == 200
    finally:
        gw.stop()
        up.stop()
