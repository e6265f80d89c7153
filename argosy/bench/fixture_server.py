"""An OpenAI-shaped streaming server whose timing is known: the first token comes `--ttft` seconds
after the request, then one token every `--token-delay` seconds, `max_tokens` of them, with usage.
Prompt tokens are counted as whitespace-separated words.

For tests and for checking load testers against each other (its figures are the truth to compare
with). `--pattern ok,500,429,drop` answers the i-th request with the i-th entry (cycling): an HTTP
error, or a stream cut off after two tokens. GET /stats gives the peak of requests in flight, the requests
answered per `user` field (its own counters: who served what) and the last traceparent headers it got.

    python -m argosy.bench.fixture_server --port 9000 --ttft 0.1 --token-delay 0.02
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections import deque

from aiohttp import web


class Fixture:
    def __init__(self, args: argparse.Namespace):
        self.ttft, self.delay, self.model = args.ttft, args.token_delay, args.model
        self.default_max_tokens = args.default_max_tokens
        self.pattern = [p.strip() for p in args.pattern.split(",") if p.strip()] or ["ok"]
        self.requests = self.in_flight = self.max_in_flight = 0
        self.by_user: dict[str, int] = {}
        self.traceparents: deque[str] = deque(maxlen=100)

    def _next_action(self) -> str:
        action = self.pattern[self.requests % len(self.pattern)]
        self.requests += 1
        return action

    async def generate(self, request: web.Request) -> web.StreamResponse:
        chat = request.path.endswith("/chat/completions")
        body = await request.json()
        user = str(body.get("user") or "")
        self.by_user[user] = self.by_user.get(user, 0) + 1
        if "traceparent" in request.headers:
            self.traceparents.append(request.headers["traceparent"])
        action = self._next_action()
        if action.isdigit():
            return web.json_response({"error": {"message": "fixture error", "type": "server_error", "param": None,
                                                "code": f"fixture_{action}"}},
                                     status=int(action))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(request, body, chat, drop=action == "drop")
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request, body: dict, chat: bool, drop: bool) -> web.StreamResponse:
        start = time.perf_counter()
        if chat:
            prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        else:
            prompt_tokens = len(str(body.get("prompt", "")).split())
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or self.default_max_tokens)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        rid, kind = f"fx-{uuid.uuid4().hex[:12]}", "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            await asyncio.sleep(self.ttft + (n - 1) * self.delay)
            text = " tok" * n
            choice = {"index": 0, "finish_reason": "length",
                      **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}
            return web.json_response({"id": rid, "object": kind, "model": self.model, "choices": [choice],
                                      "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list, usage_: dict | None = None) -> bytes:
            return b"data: " + json.dumps({"id": rid, "object": obj, "model": self.model, "choices": choices,
                                           "usage": usage_}).encode() + b"\n\n"

        if chat:  # role first, at once, as real servers do: it carries no token
            await resp.write(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "finish_reason": None}]))
        for i in range(n):
            # An absolute schedule: the delays do not drift with the event loop's wake-up jitter.
            wait = start + self.ttft + i * self.delay - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if drop and i == 2:
                request.transport.abort()  # a connection lost mid-stream
                return resp
            finish = "length" if i == n - 1 else None
            piece = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
            await resp.write(chunk([{"index": 0, **piece, "finish_reason": finish}]))
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(chunk([], usage))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response({"requests": self.requests, "in_flight": self.in_flight,
                                  "max_in_flight": self.max_in_flight, "by_user": self.by_user,
                                  "traceparents": list(self.traceparents)})

    async def reset(self, _: web.Request) -> web.Response:
        self.requests = self.max_in_flight = 0
        self.by_user.clear()
        return web.json_response({"ok": True})

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})


def make_app(args: argparse.Namespace) -> web.Application:
    fx = Fixture(args)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/completions", fx.generate)
    app.router.add_post("/v1/chat/completions", fx.generate)
    app.router.add_get("/v1/models", fx.models)
    app.router.add_get("/health", lambda _: web.Response(text="ok"))
    app.router.add_get("/stats", fx.stats)
    app.router.add_post("/stats/reset", fx.reset)
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m argosy.bench.fixture_server", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--ttft", type=float, default=0.05, help="seconds to the first token")
    p.add_argument("--token-delay", type=float, default=0.01, help="seconds between tokens")
    p.add_argument("--default-max-tokens", type=int, default=16)
    p.add_argument("--model", default="fixture")
    p.add_argument("--pattern", default="ok", help="answers in turn: ok, drop or an HTTP status (500, 429, ...)")
    args = p.parse_args(argv)
    web.run_app(make_app(args), host=args.host, port=args.port, print=None, access_log=None,
                backlog=4096)


if __name__ == "__main__":
    main()
