"""A small OpenAI-shaped upstream server (run as a subprocess) and helpers to start it and the gateway.

The upstream streams a fixed completion chunk by chunk with a configurable delay, reports vllm:*
gauges on /metrics, simulates a prefix cache (TTFT grows with the uncached part of the prompt), and
fails on command (POST /fixture/control). It is also bench/gateway_overhead.py's fast upstream.

Run: python tests/gateway_fixtures.py --name a [--ttft 0] [--token-delay 0] [--tokens 8]
It binds 127.0.0.1:0 itself and prints "PORT <n>" once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def pepper_for_tests() -> bytes:
    """The key pepper tests hash keys with (conftest sets ARGOSY_KEY_PEPPER; gateways inherit it)."""
    return os.environ["ARGOSY_KEY_PEPPER"].encode()


class Upstream:
    def __init__(self, args: argparse.Namespace):
        self.name = args.name
        self.ctl: dict[str, Any] = {
            "ttft": args.ttft, "token_delay": args.token_delay, "tokens": args.tokens,
            "fail_status": 0, "fail_count": 0, "die_after_chunks": -1, "healthy": True,
            "waiting": 0, "kv": 0.0, "text": None, "echo": False, "prefill_per_char": args.prefill_per_char,
            "fail_retry_after": 0,  # with fail_status: a Retry-After header on the injected failures (a full queue)
        }
        self.stats: dict[str, Any] = {"requests": 0, "by_model": {}, "in_flight": 0, "max_in_flight": 0,
                                      "prompt_chars": 0, "cached_chars": 0, "users": []}
        self.cache: OrderedDict[bytes, None] = OrderedDict()  # simulated prefix cache: block-hash chain LRU
        self.cache_blocks = args.cache_blocks
        self.prefill = asyncio.Lock()  # one "GPU": prefills run one at a time

    def cached_chars(self, prompt: str) -> int:
        h = hashlib.blake2b(digest_size=8)
        hit, B = 0, 64
        still = True
        for i in range(0, len(prompt) - len(prompt) % B, B):
            h.update(prompt[i:i + B].encode())
            d = h.digest()
            if still and d in self.cache:
                hit += B
                self.cache.move_to_end(d)
            else:
                still = False
                self.cache[d] = None
        while len(self.cache) > self.cache_blocks:
            self.cache.popitem(last=False)
        return hit

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                if m["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        path = scope["path"]
        if path == "/health":
            ok = self.ctl["healthy"]
            return await _send(send, 200 if ok else 503, b"{}")
        if path == "/metrics":
            s = (f"vllm:num_requests_waiting{{model_name=\"m\"}} {self.ctl['waiting']}\n"
                 f"vllm:num_requests_running{{model_name=\"m\"}} {self.stats['in_flight']}\n"
                 f"vllm:kv_cache_usage_perc{{model_name=\"m\"}} {self.ctl['kv']}\n")
            return await _send(send, 200, s.encode(), b"text/plain")
        if path == "/fixture/control":
            self.ctl.update(json.loads(body or b"{}"))
            return await _send(send, 200, json.dumps(self.ctl).encode())
        if path == "/fixture/stats":
            return await _send(send, 200, json.dumps(self.stats).encode())
        if path == "/fixture/reset":
            self.stats.update(requests=0, by_model={}, max_in_flight=0, prompt_chars=0, cached_chars=0, users=[])
            self.cache.clear()
            return await _send(send, 200, b"{}")
        if path == "/v1/models":
            return await _send(send, 200, b'{"object":"list","data":[{"id":"m","object":"model"}]}')
        if path in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings"):
            return await self.generate(path, json.loads(body), scope, send)
        return await _send(send, 404, b'{"error":{"message":"not found","type":"not_found","param":null,"code":404}}')

    async def generate(self, path: str, req: dict, scope, send) -> None:
        st, c = self.stats, self.ctl
        st["requests"] += 1
        model = req.get("model", "")
        st["by_model"][model] = st["by_model"].get(model, 0) + 1
        if req.get("user"):
            st["users"].append(req["user"])
        if c["fail_count"] > 0:
            c["fail_count"] -= 1
            if c["fail_status"] == -1:  # hang up without answering
                raise ConnectionAbortedError
            extra = [(b"retry-after", str(c["fail_retry_after"]).encode())] if c["fail_retry_after"] else []
            return await _send(send, c["fail_status"] or 500, b'{"error":{"message":"injected","type":"x"}}',
                               extra=extra)
        if path == "/v1/embeddings":
            return await _send(send, 200, json.dumps({"object": "list", "model": model, "data": [
                {"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
                "usage": {"prompt_tokens": 1, "total_tokens": 1}}).encode())
        chat = path.endswith("chat/completions")
        if chat:
            prompt = "".join(f"<{m.get('role')}>{m.get('content')}" for m in req.get("messages", []))
        else:
            p = req.get("prompt", "")
            prompt = p if isinstance(p, str) else json.dumps(p)
        st["in_flight"] += 1
        st["max_in_flight"] = max(st["max_in_flight"], st["in_flight"])
        try:
            ttft = c["ttft"]
            if c["prefill_per_char"]:
                async with self.prefill:
                    hit = self.cached_chars(prompt)
                    st["prompt_chars"] += len(prompt)
                    st["cached_chars"] += hit
                    await asyncio.sleep(ttft + (len(prompt) - hit) * c["prefill_per_char"])
            elif ttft:
                await asyncio.sleep(ttft)
            n = int(req.get("max_tokens") or c["tokens"])
            n = min(n, c["tokens"])
            if c["echo"]:  # answer with the prompt as the upstream received it (guardrail tests)
                words = prompt.split(" ")
            else:
                words = c["text"].split(" ") if c["text"] else [f"w{i}" for i in range(n)]
            pieces = [(" " if i else "") + w for i, w in enumerate(words)]
            usage = {"prompt_tokens": max(1, len(prompt) // 4), "completion_tokens": len(pieces),
                     "total_tokens": max(1, len(prompt) // 4) + len(pieces)}
            common = {"id": "cmpl-fx", "created": 0, "model": model, "system_fingerprint": self.name}
            if not req.get("stream"):
                await asyncio.sleep(c["token_delay"] * len(pieces))
                text = "".join(pieces)
                choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                          if chat else {"index": 0, "text": text, "finish_reason": "length"})
                obj = {**common, "object": "chat.completion" if chat else "text_completion",
                       "choices": [choice], "usage": usage}
                return await _send(send, 200, json.dumps(obj).encode())
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            obj_name = "chat.completion.chunk" if chat else "text_completion"
            for i, piece in enumerate(pieces):
                if c["die_after_chunks"] >= 0 and i >= c["die_after_chunks"]:
                    c["die_after_chunks"] = -1
                    raise ConnectionAbortedError  # uvicorn closes the connection mid-stream
                last = i == len(pieces) - 1
                fin = "length" if last else None
                choice = ({"index": 0, "delta": {"content": piece}, "finish_reason": fin} if chat
                          else {"index": 0, "text": piece, "finish_reason": fin})
                ev = {**common, "object": obj_name, "choices": [choice]}
                await send({"type": "http.response.body", "body": b"data: " + json.dumps(ev).encode() + b"\n\n",
                            "more_body": True})
                if c["token_delay"] and not last:
                    await asyncio.sleep(c["token_delay"])
            tail = b""
            if (req.get("stream_options") or {}).get("include_usage"):
                tail = b"data: " + json.dumps({**common, "object": obj_name, "choices": [], "usage": usage}).encode()
                tail += b"\n\n"
            await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n", "more_body": False})
        finally:
            st["in_flight"] -= 1


async def _send(send, status: int, body: bytes, ctype: bytes = b"application/json", extra=()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="up")
    ap.add_argument("--ttft", type=float, default=0.0)
    ap.add_argument("--token-delay", type=float, default=0.0)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--prefill-per-char", type=float, default=0.0)
    ap.add_argument("--cache-blocks", type=int, default=4096)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(2048)  # before announcing the port: connections wait in the backlog until uvicorn runs
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    cfg = uvicorn.Config(Upstream(args), log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(cfg).run(sockets=[sock])


# ---------------------------------------------------------------- helpers used by tests and benches


class Proc:
    """A subprocess that printed the URL it listens on; stop() ends it and waits."""

    def __init__(self, popen: subprocess.Popen, url: str):
        self.popen, self.url = popen, url

    def control(self, **kw: Any) -> dict:
        return httpx.post(self.url + "/fixture/control", json=kw, timeout=5).json()

    def stats(self) -> dict:
        return httpx.get(self.url + "/fixture/stats", timeout=5).json()

    def reset(self) -> None:
        httpx.post(self.url + "/fixture/reset", timeout=5)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        for f in (self.popen.stdout, self.popen.stderr):
            if f:
                f.close()


def _wait_line(p: subprocess.Popen, prefix: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    assert p.stdout is not None
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            if p.poll() is not None:
                err = p.stderr.read() if p.stderr else ""
                raise RuntimeError(f"process exited ({p.returncode}) before listening: {err[-2000:]}")
            continue
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    p.kill()
    raise RuntimeError("process did not start in time")


def start_upstream(name: str = "up", **opts: Any) -> Proc:
    cmd = [PY, str(Path(__file__).resolve()), "--name", name]
    for k, v in opts.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    port = _wait_line(p, "PORT ")
    return Proc(p, f"http://127.0.0.1:{port}")


def start_gateway(config: dict, *args: str, env: dict | None = None) -> Proc:
    """Start `python -m argosy.gateway` on a free port with this fleet config (a dict)."""
    config = dict(config)
    config.setdefault("gateway", {})
    config["gateway"] = {"port": 0, **config["gateway"]}
    fd, path = tempfile.mkstemp(suffix=".yaml", prefix="fleet-")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f)
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    p = subprocess.Popen([PY, "-m", "argosy.gateway", "--config", path, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=e, cwd=ROOT)
    try:
        url = _wait_line(p, "argosy gateway listening on ").split()[0]  # then "(region NAME)", if any
    finally:
        os.unlink(path)
    # It prints its address once bound, before its startup (Redis, sessions) ran: wait until it answers.
    deadline = time.monotonic() + 60
    while p.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2, verify=False).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    if p.poll() is not None:
        raise RuntimeError(f"gateway exited ({p.returncode}) at startup: {p.stderr.read()[-2000:]}")
    return Proc(p, url)


def start_redis(port: int | None = None) -> tuple[subprocess.Popen, str]:
    """redis-server on a free port (or this one), once it answers PING. A probe that merely connects is
    not enough: with no listener yet, a connect to a port in the ephemeral range can connect the socket
    to itself, and redis then fails to bind; so the answer must be +PONG, and a redis that exited is
    started again on another port."""
    for _ in range(5):
        if port is None:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
        p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and p.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), 0.5) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return p, f"redis://127.0.0.1:{port}/0"
            except OSError:
                pass
            time.sleep(0.05)
        p.kill()
        p.wait(10)
        port = None
    raise RuntimeError("redis-server did not start")


if __name__ == "__main__":
    main()
