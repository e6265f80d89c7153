"""A model as the gateway sees it: admission, guardrails, weighted routes between revisions (the
mechanism canary rollouts use) and shadow mirroring of a sampled share of requests.

ModelRuntime is also what the fleet controller drives (argosy.fleet.seams.ModelRoutes): replicas join
and leave its routing sets, it reports in-flight and finished counts per replica and the admission
load, and the controller's activator hook holds requests while a model scaled to zero starts.

Shadows run as background tasks against their own upstreams: never awaited by the user's request,
dropped (not queued) beyond `shadow.max_in_flight`; the gateway records their latency and whether
their output agrees with what the user got.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable

import aiohttp

from argosy.config import GatewayConfig, ModelConfig, TrafficRoute
from argosy.gateway.admission import Admission, AdmissionLoad
from argosy.gateway.guardrails import Guardrails
from argosy.gateway.health import Upstream
from argosy.gateway.prefix_index import PrefixIndex
from argosy.gateway.router import Router, RouteRequest
from argosy.gateway.scraper import ReplicaGauges

log = logging.getLogger("argosy.gateway")


class UpstreamRegistry:
    """One Upstream per URL, shared by every model and revision that lists it."""

    def __init__(self, gw: GatewayConfig):
        self.gw = gw
        self.by_url: dict[str, Upstream] = {}

    def get(self, url: str) -> Upstream:
        url = url.rstrip("/")
        u = self.by_url.get(url)
        if u is None:
            u = self.by_url[url] = Upstream(url, self.gw.eject_after_failures, self.gw.eject_for_s)
        return u

    def find(self, url: str) -> Upstream | None:
        return self.by_url.get(url.rstrip("/"))

    def forget(self, url: str) -> None:
        """Drop an upstream's state (breaker, counts): a later replica on the same address starts fresh."""
        self.by_url.pop(url.rstrip("/"), None)

    def take_gauges(self, url: str, g: ReplicaGauges) -> None:
        """A replica's scraped load (ReplicaScraper): the queue and KV usage this gateway does not see."""
        u = self.by_url.get(url)
        if u is not None:
            u.waiting, u.kv_usage = g.waiting, g.kv_usage


class ModelRuntime:
    def __init__(self, cfg: ModelConfig, reg: UpstreamRegistry, index: PrefixIndex, on_insert, session_getter):
        self.cfg, self.name, self.reg = cfg, cfg.name, reg
        self.admission = Admission(cfg.admission)
        self.tokens_in_flight = 0  # estimated tokens of the requests admitted or queued (Gateway.admitted)
        g = cfg.guardrails
        self.guardrails = Guardrails(g, session_getter) if (g.input or g.output) else None
        self.output_guard = self.guardrails if g.output else None
        self.routers: dict[str, Router] = {}
        routes = cfg.traffic or [TrafficRoute(revision=cfg.revision, weight=1.0)]
        self.weights: list[tuple[str, float]] = []
        for r in routes:
            own = r.revision == cfg.revision
            urls = r.upstreams if r.upstreams is not None else (cfg.upstreams or [] if own else [])
            self._router(r.revision, urls, index, on_insert)
            self.weights.append((r.revision, r.weight))
        self.total_weight = sum(w for _, w in self.weights) or 1.0
        self.shadow = cfg.shadow
        self.shadow_router: Router | None = None
        # Set by the fleet controller (argosy serve): `await activator()` holds a request while the model
        # has no live upstream and a replica is starting (scale from zero), or raises a GatewayError.
        self.activator: Callable[[], Awaitable[None]] | None = None
        if cfg.shadow:
            least_load = cfg.routing.model_copy(update={"policy": "least_load", "scorers": None})
            self.shadow_router = Router(least_load, None, index)
            self.shadow_router.set_upstreams([reg.get(x) for x in cfg.shadow.upstreams or []])

    def _router(self, revision: str, urls: list[str], index, on_insert) -> Router:
        r = Router(self.cfg.routing, self.cfg.length_classes, index, on_insert)
        r.set_upstreams([self.reg.get(x) for x in urls])
        self.routers[revision] = r
        return r

    def pick(self, session_key: str | None) -> tuple[str, Router]:
        if len(self.weights) == 1:
            rev = self.weights[0][0]
            return rev, self.routers[rev]
        # A session keeps its revision (stable hash); other requests split at random by weight.
        if session_key:
            x = int.from_bytes(hashlib.blake2b(session_key.encode(), digest_size=8).digest(), "big") / 2**64
        else:
            x = random.random()
        x *= self.total_weight
        for rev, w in self.weights:
            if x < w:
                return rev, self.routers[rev]
            x -= w
        return self.weights[-1][0], self.routers[self.weights[-1][0]]

    def upstreams(self) -> list[Upstream]:
        seen = {u.url: u for r in self.routers.values() for u in r.upstreams}
        if self.shadow_router:
            seen.update({u.url: u for u in self.shadow_router.upstreams})
        return list(seen.values())

    def add_upstream(self, url: str, revision: str | None = None) -> None:
        r = self.routers.get(revision or self.cfg.revision) or self.routers[self.weights[0][0]]
        if url.rstrip("/") not in {u.url for u in r.upstreams}:
            r.set_upstreams([*r.upstreams, self.reg.get(url)])

    def remove_upstream(self, url: str) -> bool:
        url, found = url.rstrip("/"), False
        for r in self.routers.values():
            if any(u.url == url for u in r.upstreams):
                r.set_upstreams([u for u in r.upstreams if u.url != url])
                found = True
        return found

    # ------------------------------------------------------------------ what the fleet controller reads

    def in_flight(self, url: str) -> int:
        """This gateway's requests in flight on one upstream (0 for one it does not know)."""
        u = self.reg.find(url)
        return u.in_flight if u is not None else 0

    def finished(self, url: str) -> int | None:
        """Requests this gateway finished on one upstream, answered or failed; None for one it does not know."""
        u = self.reg.find(url)
        return None if u is None else u.served + u.failed

    def admission_load(self) -> AdmissionLoad:
        return dataclasses.replace(self.admission.load(), tokens=self.tokens_in_flight)

    def has_live_upstream(self) -> bool:
        return any(u.available() for r in self.routers.values() for u in r.upstreams)

    def set_activator(self, hook: Callable[[], Awaitable[None]] | None) -> None:
        self.activator = hook


def response_text(chunks: list[bytes], stream: bool) -> str:
    """The first choice's text from a whole response body or a list of raw SSE chunks."""
    try:
        if not stream:
            ch = json.loads(b"".join(chunks))["choices"][0]
            return ch.get("text") or (ch.get("message") or {}).get("content") or ""
        out = []
        for ev in b"".join(chunks).split(b"\n\n"):
            if ev.startswith(b"data: {"):
                for ch in json.loads(ev[6:]).get("choices", []):
                    if ch.get("index", 0) == 0:
                        out.append(ch.get("text") or (ch.get("delta") or {}).get("content") or "")
        return "".join(out)
    except (ValueError, KeyError, IndexError, TypeError):
        return ""


class Shadower:
    def __init__(self, session_getter, metrics):
        self.session, self.m = session_getter, metrics
        self.in_flight: dict[str, int] = {}
        self.tasks: set[asyncio.Task] = set()

    def maybe_start(self, rt: ModelRuntime, path: str, req: dict, rreq: RouteRequest) -> asyncio.Future | None:
        """Start a shadow for a sampled request; returns the future the user's output goes into."""
        sh = rt.shadow
        if sh is None or random.random() >= sh.sample:
            return None
        if self.in_flight.get(rt.name, 0) >= sh.max_in_flight:
            self.m.shadow.labels(rt.name, "dropped").inc()
            return None
        user_out: asyncio.Future = asyncio.get_running_loop().create_future()
        t = asyncio.get_running_loop().create_task(self._run(rt, path, req, rreq, user_out))
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)
        return user_out

    async def _run(self, rt: ModelRuntime, path: str, req: dict, rreq: RouteRequest, user_out) -> None:
        self.in_flight[rt.name] = self.in_flight.get(rt.name, 0) + 1
        outcome = "error"
        try:
            u = rt.shadow_router.choose(rreq) if rt.shadow_router else None
            if u is None:
                outcome = "no_upstream"
                return
            body = json.dumps({**req, "stream": False, "stream_options": None}).encode()
            t0 = time.monotonic()
            async with self.session().post(u.url + path, data=body, headers={"content-type": "application/json"},
                                           timeout=aiohttp.ClientTimeout(total=300)) as r:
                data = await r.read()
                ok = r.status == 200
            self.m.shadow_latency.labels(rt.name).observe(time.monotonic() - t0)
            if not ok:
                return
            user_chunks, user_stream = await asyncio.wait_for(user_out, 600)
            same = response_text([data], False) == response_text(user_chunks, user_stream)
            outcome = "agree" if same else "disagree"
        except Exception as e:  # a shadow never affects anything but its own metrics
            log.info("shadow request for %s failed: %s", rt.name, type(e).__name__)
        finally:
            self.in_flight[rt.name] -= 1
            self.m.shadow.labels(rt.name, outcome).inc()
            if not user_out.done():
                user_out.cancel()

    async def stop(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
