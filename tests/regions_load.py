"""Steady load from the users of each region: closed-loop users with the official `openai` client, each
request through its region's entry (a unix socket into the hub: tests/netns_hub.py), one new connection
per request (so an entry's failover and fail-back apply to each), with the client's default retries.

Each request is recorded: which region's users sent it, when, its TTFT (streamed), where it was served
(the x-argosy-region answer header), and whether it completed (a stream ends with a finish_reason; a
full answer has its text).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
import openai


@dataclass
class Done:
    client: str  # the region whose users sent it
    t0: float  # monotonic start
    end: float
    served: str | None  # x-argosy-region
    ok: bool
    ttft: float | None = None
    error: str = ""
    status: int | None = None
    retry_after: str | None = None
    retries: int = 0
    tag: str = ""


@dataclass
class Users:
    """How a group of a region's users behaves now (change it while the load runs)."""
    region: str
    count: int = 0
    model: str = "chat"
    stream: bool = True
    max_tokens: int = 8
    key: str = ""
    tag: str = ""  # sent as the request's `user` (the fixture counts per user: who served what)
    think_s: float = 0.02
    headers: dict = field(default_factory=dict)
    max_retries: int = 2  # the openai client's default


class Load:
    """Groups of users; a region's name is its plain users' group, others are named (e.g. "us-east/pinned")."""

    def __init__(self, sockdir: str, regions: list[str], key: str):
        self.sockdir, self.regions, self.key = sockdir, regions, key
        self.users = {r: Users(r, key=key) for r in regions}
        self.done: list[Done] = []
        self.tasks: dict[str, list[asyncio.Task]] = {r: [] for r in regions}
        self.stopping = False

    def client(self, region: str, key: str, max_retries: int) -> openai.AsyncOpenAI:
        transport = httpx.AsyncHTTPTransport(uds=f"{self.sockdir}/entry-{region}.sock")
        http = httpx.AsyncClient(transport=transport, headers={"connection": "close"},  # each request: the entry picks
                                 timeout=httpx.Timeout(60.0, connect=5.0))
        return openai.AsyncOpenAI(base_url="http://entry/v1", api_key=key, http_client=http, max_retries=max_retries)

    async def one(self, region: str, u: Users, c: openai.AsyncOpenAI) -> Done:
        t0 = time.monotonic()
        d = Done(region, t0, t0, None, False, tag=u.tag)
        try:
            if u.stream:
                async with c.completions.with_streaming_response.create(
                        model=u.model, prompt="hello from " + region, max_tokens=u.max_tokens, stream=True,
                        user=u.tag or None, extra_body={"ignore_eos": True}, extra_headers=u.headers) as resp:
                    d.served, d.status = resp.headers.get("x-argosy-region"), resp.status_code
                    finish = None
                    async for chunk in await resp.parse():
                        if d.ttft is None and chunk.choices and chunk.choices[0].text:
                            d.ttft = time.monotonic() - t0
                        if chunk.choices and chunk.choices[0].finish_reason:
                            finish = chunk.choices[0].finish_reason
                    d.ok = finish is not None
                    d.error = "" if d.ok else "stream ended without a finish_reason"
            else:
                raw = await c.completions.with_raw_response.create(
                    model=u.model, prompt="hello from " + region, max_tokens=u.max_tokens, user=u.tag or None,
                    extra_body={"ignore_eos": True}, extra_headers=u.headers)
                d.served, d.status, d.retries = raw.headers.get("x-argosy-region"), raw.status_code, raw.retries_taken
                d.ok = bool(raw.parse().choices[0].text)
        except openai.APIStatusError as e:
            d.status, d.error = e.status_code, f"HTTP {e.status_code}: {e.message[:200]}"
            d.retry_after = e.response.headers.get("retry-after")
        except (openai.APIError, httpx.HTTPError) as e:
            d.error = f"{type(e).__name__}: {e}"[:300]
        d.end = time.monotonic()
        return d

    async def user(self, group: str, index: int) -> None:
        clients: dict[tuple, openai.AsyncOpenAI] = {}
        try:
            while not self.stopping and index < self.users[group].count:
                u = self.users[group]
                which = (u.key, u.max_retries)
                c = clients.get(which) or clients.setdefault(which, self.client(u.region, u.key, u.max_retries))
                self.done.append(await self.one(u.region, u, c))
                await asyncio.sleep(u.think_s)
        finally:
            for c in clients.values():
                await c.close()

    def set(self, group: str, **changes) -> None:
        """Change a group of users (a new group needs `region`); more users start now, fewer finish their
        request and stop."""
        if group not in self.users:
            self.users[group] = Users(changes.pop("region"), key=self.key)
            self.tasks[group] = []
        u = self.users[group]
        for k, v in changes.items():
            setattr(u, k, v)
        live = [t for t in self.tasks[group] if not t.done()]
        self.tasks[group] = live
        for i in range(len(live), u.count):
            self.tasks[group].append(asyncio.get_running_loop().create_task(self.user(group, i)))

    async def open_loop(self, region: str, rate: float, duration: float, seed: int = 0, **fields) -> None:
        """Poisson arrivals at `rate` req/s for `duration` s from the region's users (not waiting for answers:
        as the simulator's traffic), then wait for the last answers."""
        import random

        rng, u = random.Random(seed), Users(region, key=self.key, **fields)
        c = self.client(region, u.key, u.max_retries)
        pending: set[asyncio.Task] = set()
        end, t = time.monotonic() + duration, time.monotonic()
        try:
            while True:
                t += rng.expovariate(rate)
                if t >= end:
                    break
                await asyncio.sleep(max(0.0, t - time.monotonic()))
                task = asyncio.get_running_loop().create_task(self.one(region, u, c))
                task.add_done_callback(lambda tk: self.done.append(tk.result()))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.gather(*pending, return_exceptions=True)
        finally:
            await c.close()

    async def idle(self, *groups: str) -> None:
        """Wait until these groups' users (set to fewer) have finished their requests."""
        await asyncio.gather(*(t for g in groups for t in self.tasks[g][self.users[g].count:]),
                             return_exceptions=True)

    async def stop(self) -> None:
        self.stopping = True
        tasks = [t for ts in self.tasks.values() for t in ts]
        await asyncio.gather(*tasks, return_exceptions=True)

    def window(self, t0: float, t1: float, client: str | None = None, tag: str | None = None) -> list[Done]:
        return [d for d in self.done if t0 <= d.t0 < t1 and (client is None or d.client == client)
                and (tag is None or d.tag == tag)]


def served_by(done: list[Done]) -> dict[str | None, int]:
    out: dict[str | None, int] = {}
    for d in done:
        if d.ok:
            out[d.served] = out.get(d.served, 0) + 1
    return out


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")
