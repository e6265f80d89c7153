"""The gateway's own HTTP/1.1 client, against raw sockets that misbehave in the ways upstreams do."""

from __future__ import annotations

import asyncio
import socket

import pytest

from argosy.gateway.upstream_client import HIGH_WATER, UpstreamClient

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def serve(handler):
    """A raw server on 127.0.0.1; handler(reader, writer, n) gets each connection and its number."""
    count = 0

    async def on_conn(reader, writer):
        nonlocal count
        count += 1
        try:
            await handler(reader, writer, count)
        finally:
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", lambda: count


async def read_request(reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    n = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    return head + await reader.readexactly(n)


def run_against(handler, check) -> None:
    """Runs check(client, url, connections) against a raw server with this handler; stops both after."""
    async def main():
        server, url, conns = await serve(handler)
        client = UpstreamClient(2.0)
        try:
            await check(client, url, conns)
        finally:
            await client.close()
            server.close()

    asyncio.run(main())


def test_keep_alive_reuses_one_connection_and_a_stale_one_is_replaced():
    async def handler(reader, writer, n):
        for i in range(100):
            try:
                req = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            if n == 1 and i == 2:
                return  # its keep-alive ran out as the third request came: closed, unanswered
            assert b"x-request-id: r1" in req and req.endswith(b'{"a": 1}')
            writer.write(OK)
            await writer.drain()

    async def check(client, url, conns):
        for _ in range(5):
            r = await client.post(url + "/v1/completions", b'{"a": 1}', {"x-request-id": "r1"})
            assert r.status == 200 and r.headers["content-type"] == "application/json" and await r.read() == b"{}"
            r.release()
        assert conns() == 2  # one kept alive, then one more after the upstream closed it: no error surfaced

    run_against(handler, check)


def test_body_without_length_ends_with_the_connection_and_chunks_stream_in_order():
    async def handler(reader, writer, n):
        await read_request(reader)
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\nall of it")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            for i in range(3):
                data = f"data: {i}\n\n".encode()
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
                await asyncio.sleep(0.02)
            writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def check(client, url, _conns):
        r = await client.post(url + "/x", b"", {})
        assert await r.read() == b"all of it"
        r.release()
        r = await client.post(url + "/x", b"", {})
        chunks = [c async for c in r.content.iter_any()]
        assert b"".join(chunks) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n" and len(chunks) == 3  # as they came
        r.release()

    run_against(handler, check)


def test_a_slow_reader_pauses_the_upstream_and_loses_nothing():
    total = 4 * HIGH_WATER
    payload = bytes(range(256)) * (total // 256)

    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        writer.write(payload)
        await writer.drain()

    async def check(client, url, _conns):
        r = await client.post(url + "/big", b"", {})
        got, paused = [], False
        while chunk := await r.content.readany():
            got.append(chunk)
            paused = paused or r._paused
            await asyncio.sleep(0.001)
        assert b"".join(got) == payload and paused  # reading was paused while the buffer was full
        r.release()

    run_against(handler, check)


def test_failures_are_oserrors_the_proxy_retries_on():
    async def handler(reader, writer, n):
        await read_request(reader)
        if n == 1:
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        else:  # headers, half a body, then the connection drops
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhalf")
        await writer.drain()

    async def check(client, url, _conns):
        with pytest.raises(OSError, match="malformed"):
            await client.post(url + "/x", b"", {})
        r = await client.post(url + "/x", b"", {})
        with pytest.raises(OSError, match="closed"):
            await r.read()
        r.release()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # nothing listens here once the socket is closed
        with pytest.raises(OSError):
            await client.post(f"http://127.0.0.1:{port}/x", b"", {})

    run_against(handler, check)


def test_bytes_on_an_idle_connection_retire_it_and_a_double_release_pools_once():
    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        if n == 1:  # the first connection then sends bytes nobody asked for
            await asyncio.sleep(0.02)
            writer.write(b"HTTP/1.1 200 OK\r\n")
            await writer.drain()
        try:
            await read_request(reader)
            writer.write(OK)
            await writer.drain()
        except asyncio.IncompleteReadError:
            return

    async def check(client, url, conns):
        r = await client.post(url + "/x", b"", {})
        assert await r.read() == b"{}"
        r.release()
        r.release()
        await asyncio.sleep(0.05)  # the stray bytes arrive on the pooled connection
        r = await client.post(url + "/x", b"", {})
        assert r.status == 200 and await r.read() == b"{}"
        r.release()
        assert conns() == 2 and sum(len(v) for v in client._idle.values()) <= 2

    run_against(handler, check)
