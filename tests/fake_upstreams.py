"""Misbehaving upstreams for the gateway's fault tests: small asyncio servers on 127.0.0.1, in a thread.

Each answers `GET /health` and `/metrics` like a healthy replica (so only requests see the fault) and
answers `POST` according to its behaviour:
  ok            a correct completion (streamed when asked), after `delay` seconds
  silent        reads the request and never answers
  garbage       answers bytes that are not HTTP
  close_headers sends half a response head, then closes
  trickle       sends a correct response one byte a second
  stall_stream  starts an SSE stream, sends two events, then goes silent (connection kept open)
  stall_body    sends a head announcing 1000 bytes, then 10 of them, then goes silent
It counts requests and the most connections it held open at once. `behaviour` may be changed while it
runs (an upstream that goes bad); with `whole=True` health checks and scrapes get the fault too (a
process that hangs or breaks answers nothing well).
"""

from __future__ import annotations

import asyncio
import json
import threading

BEHAVIOURS = ("ok", "silent", "garbage", "close_headers", "trickle", "stall_stream", "stall_body")


def completion(stream: bool) -> list[bytes]:
    if not stream:
        body = json.dumps({"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "m",
                           "choices": [{"index": 0, "text": " fake", "finish_reason": "length"}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        return [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body]
    events = [b"data: " + json.dumps({"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "m",
                                      "choices": [{"index": 0, "text": f" w{i}",
                                                   "finish_reason": "length" if i == 2 else None}]}).encode()
              + b"\n\n" for i in range(3)] + [b"data: [DONE]\n\n"]
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return [head] + [b"%x\r\n%s\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]


class FakeUpstream:
    def __init__(self, behaviour: str = "ok", delay: float = 0.0, whole: bool = False):
        assert behaviour in BEHAVIOURS, behaviour
        self.behaviour, self.delay, self.whole = behaviour, delay, whole
        self.requests = self.open = self.max_open = 0
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self._started.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._conn, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self._started.set()
        self.loop.run_forever()

    def stop(self) -> None:
        async def close():
            self.server.close()
            for t in asyncio.all_tasks():
                if t is not asyncio.current_task():
                    t.cancel()
        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _read_request(self, reader) -> tuple[str, str, bytes] | None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path = lines[0].split(" ")[:2]
        length = 0
        for line in lines[1:]:
            if line.lower().startswith("content-length:"):
                length = int(line.split(":", 1)[1])
        body = await reader.readexactly(length) if length else b""
        return method, path, body

    async def _conn(self, reader, writer) -> None:
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        try:
            while True:
                try:
                    method, path, body = await self._read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError, ValueError):
                    return
                if method == "GET" and self.whole and self.behaviour != "ok":
                    if not await self._answer(writer, False, delay=False):
                        return
                    continue
                if method == "GET":
                    text = (b"vllm:num_requests_waiting 0\n" if path == "/metrics" else b'{"status":"ok"}')
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(text), text))
                    await writer.drain()
                    continue
                self.requests += 1
                stream = bool(json.loads(body or b"{}").get("stream"))
                if not await self._answer(writer, stream):
                    return
        except (ConnectionError, asyncio.CancelledError):
            return  # the gateway gave up on this connection, or the fake is stopping
        finally:
            self.open -= 1
            writer.close()

    async def _answer(self, writer, stream: bool, delay: bool = True) -> bool:
        """Answers one POST; False when the connection is done with."""
        b = self.behaviour
        if self.delay and delay:
            await asyncio.sleep(self.delay)
        if b == "ok":
            for part in completion(stream):
                writer.write(part)
                await writer.drain()
            return True
        if b in ("silent", "stall_stream", "stall_body"):
            if b == "stall_stream":
                parts = completion(True)
                writer.write(b"".join(parts[:3]))
            elif b == "stall_body":
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n"
                             + b'{"id": "x"')
            await writer.drain()
            await asyncio.sleep(3600)
        if b == "garbage":
            writer.write(b"\x00\xffthis is not HTTP at all\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.2)
            return False
        if b == "close_headers":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: appl")
            await writer.drain()
            return False
        if b == "trickle":
            for byte in b"".join(completion(stream)):
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1.0)
            return True
        return False
