"""The gateway's ASGI app: requests dispatched by the route table (gateway/routes.py), and a proxied request
(the OpenAI endpoints) as its steps.

A plain ASGI callable rather than a framework router: the per-request path is the product here.
Per request: authenticate, read and check the body, input guardrails, per-key limits, admission,
wait for a replica, route, forward, account (Gateway.handle).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import aiohttp
from prometheus_client import CollectorRegistry

from argosy.config import FleetConfig
from argosy.cost.prices import load_prices
from argosy.gateway import admin
from argosy.gateway.accounting import account, key_class
from argosy.gateway.admission import PRIORITY
from argosy.gateway.asgi import Receive, Scope, Send, client_gone, header, respond
from argosy.gateway.auth import Authenticator
from argosy.gateway.bodies import ProxiedRequest
from argosy.gateway.components import (
    DEFAULT_MODEL_PATHS,
    ENCODER_PATHS,
    TEI_PATHS,
    TOKENIZER_PATHS,
    check_endpoint,
    encoder_prompt,
    tei_error_body,
    with_default_model,
)
from argosy.gateway.cors import Cors, is_preflight
from argosy.gateway.errors import GatewayError, rate_limited, usd
from argosy.gateway.fleet_view import FleetView
from argosy.gateway.health import HealthChecker
from argosy.gateway.key_sync import KeySync
from argosy.gateway.keys import KeyRecord, KeyStore
from argosy.gateway.limits import read_body
from argosy.gateway.metrics import GatewayMetrics
from argosy.gateway.model_cards import ModelCards
from argosy.gateway.prefix_index import PrefixIndex
from argosy.gateway.proxy import Call, Proxy, unless_gone_or_499
from argosy.gateway.ratelimit import MemoryLimiter, RedisLimiter
from argosy.gateway.regions.exchange import RegionExchange
from argosy.gateway.regions.forwarding import regional, serve_elsewhere
from argosy.gateway.regions.metrics import RegionMetrics
from argosy.gateway.regions.service import Regions
from argosy.gateway.revision_stats import LIVE, RequestSample, output_tokens
from argosy.gateway.router import RouteRequest
from argosy.gateway.routes import handler_for
from argosy.gateway.scraper import ReplicaScraper
from argosy.gateway.shadow import Shadower
from argosy.gateway.traffic import ModelRuntime, UpstreamRegistry
from argosy.gateway.upstream_auth import UpstreamAuth
from argosy.gateway.upstream_client import UpstreamClient
from argosy.observe.gateway_requests import GatewayRequest, serve_request
from argosy.observe.sampler import Sampler
from argosy.observe.tracing import make_tracing
from argosy.startup_heap import freeze_startup_heap

log = logging.getLogger("argosy.gateway")


class Gateway:
    def __init__(self, fleet: FleetConfig):
        self.fleet, gw = fleet, fleet.gateway
        self.m = GatewayMetrics()
        self.registry: CollectorRegistry = self.m.registry
        self.keys = KeyStore.from_fleet(fleet)
        self.auth = Authenticator(self.keys, gw.auth_failures_per_minute)
        self.admin_digest: bytes | None = None  # SHA-256 of the admin key once verified (admin.require_admin)
        # Where it listens (`--host` overrides the file; cli.bind writes it back): beyond loopback, admin
        # endpoints and replica URLs need the admin key whatever else is set.
        self.loopback_only = admin.is_loopback(gw.host)
        self.cors = Cors(gw.cors_allow_origins)
        self.reg = UpstreamRegistry(gw)
        self.upstream_auth = UpstreamAuth(self.reg.by_url)  # what replicas are shown (argosy engine --api-key)
        r0 = fleet.models[0].routing if fleet.models else None
        self.index = PrefixIndex(r0.prefix_max_blocks if r0 else 200_000, r0.prefix_ttl_s if r0 else 600.0)
        self.session: aiohttp.ClientSession | None = None
        self.scraper = ReplicaScraper(lambda: self.session, gw.health_timeout_s, self.reg.take_gauges)
        self.shared = None
        self.limiter = MemoryLimiter()
        self.models = {m.name: ModelRuntime(m, self.reg, self.index, self._on_insert, lambda: self.session)
                       for m in fleet.models}
        self.kinds = {m.name: m.kind for m in fleet.models}  # generate, embed, rerank (components.py)
        self.shadower = Shadower(lambda: self.session, self.m)
        for rt in self.models.values():
            rt.pairs = self.shadower.pairs  # shadow pairs: the rollout's agreement gate, the report
        self.m.watch(lambda: ((name, rt.admission_load()) for name, rt in self.models.items()),
                     lambda: self.reg.by_url.values())
        self.model_cards = ModelCards()  # /v1/models: the replicas' cards, cached
        self.prices = load_prices(gw.prices)  # keys' spend and budgets (served_prices)
        self.key_sync: KeySync | None = None  # with redis: keys added and revoked at run time, shared
        self.local_admin_digest: bytes | None = None  # the local admin credential's SHA-256 (local_admin.py)
        self.log_content = gw.log_content
        self.tracing = make_tracing("argosy-gateway", gw.otlp_endpoint)  # None (no per-request work) unless set
        self.fleet_view: FleetView | None = None  # the controller, under `argosy serve`
        self.sampler = Sampler(self.registry)  # the dashboard's time series (sampled only while it is open)
        # Regions (docs/regions.md): this gateway among the other regions' (gateway.region / --region).
        self.regions = Regions(fleet) if fleet.regions and gw.region else None
        self.region_exchange = RegionExchange(self.regions, lambda: self.models, lambda: self.session) \
            if self.regions is not None else None
        self.region_metrics = RegionMetrics(self.registry, self.regions)

    def _on_insert(self, hashes: list[bytes], url: str) -> None:
        if self.shared is not None:
            self.shared.publish_prefix(hashes, url)

    # ------------------------------------------------------------------ what the fleet controller uses

    def model(self, name: str) -> ModelRuntime:
        return self.models[name]

    def forget_upstream(self, url: str) -> None:
        self.reg.forget(url)
        self.scraper.forget(url)
        self.upstream_auth.forget(url)

    def attach_fleet(self, fleet: FleetView) -> None:
        self.fleet_view = fleet

    # ------------------------------------------------------------------ lifecycle

    async def startup(self) -> None:
        gw = self.fleet.gateway
        # Proxied calls go through UpstreamClient (see its docstring); this pooled aiohttp session serves
        # health checks, scrapes, guardrails, shadow traffic and https:// upstreams (keep-alive connections
        # are the point; aiohttp, not httpx: 0.18-0.22 ms per call against 0.70-0.75 ms, measured here).
        conn = aiohttp.TCPConnector(limit=0, limit_per_host=gw.max_upstream_connections, ttl_dns_cache=300,
                                    keepalive_timeout=60)
        self.session = aiohttp.ClientSession(connector=conn, auto_decompress=False, timeout=aiohttp.ClientTimeout(
            total=None, connect=gw.connect_timeout_s, sock_read=None), middlewares=(self.upstream_auth.middleware(),))
        self.upstreams = UpstreamClient(gw.connect_timeout_s, gw.first_byte_timeout_s, gw.idle_read_timeout_s,
                                        gw.max_upstream_connections, self.upstream_auth)
        self.proxy = Proxy(self.session, self.m, gw.max_retries, gw.retry_budget, retry_after=gw.eject_for_s,
                           client=self.upstreams)
        if gw.redis_url:
            import redis.asyncio as aioredis

            from argosy.gateway.shared import Shared

            r = aioredis.from_url(gw.redis_url)
            self.limiter = RedisLimiter(r)
            self.shared = Shared(r, self.reg, self.index, gw.shared_sync_s)
            await self.shared.start()
            self.key_sync = KeySync(r, self.keys, [KeyRecord.from_config(k) for k in self.fleet.keys],
                                    self.shared.gid)
            await self.key_sync.start()
        self.health = HealthChecker(self.session, gw.health_interval_s, gw.health_timeout_s, self.scraper)
        from argosy.gateway.discovery import Discovery  # models with `discover:` (Kubernetes headless Services)

        self.discovery = Discovery(self, gw.health_interval_s)
        self.health.start(lambda: self.reg.by_url.values(), self.gauge_urls)
        self.discovery.start()
        if self.region_exchange is not None:
            self.region_exchange.start()

    def gauge_urls(self) -> set[str]:
        """Upstreams whose load gauges a router of theirs reads, as the routing sets stand now."""
        return {u.url for rt in self.models.values() if any(r.needs_gauges for r in rt.routers.values())
                for u in rt.upstreams()}

    async def shutdown(self) -> None:
        await self.discovery.stop()
        await self.health.stop()
        if self.region_exchange is not None:
            await self.region_exchange.stop()
        await self.shadower.stop()
        if self.key_sync is not None:
            await self.key_sync.stop()
        if self.shared is not None:
            await self.shared.stop()
        if self.session is not None:
            await self.session.close()
            await self.upstreams.close()
        self.keys.close()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # export the spans still queued

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await self.startup()
                    freeze_startup_heap()  # the gateway's start-up objects: out of every later collection
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await self.shutdown()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] == "websocket":  # no WebSocket routes: a 403, not uvicorn's 500 and an error log line
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            return
        origin = self.cors.allowed(scope)  # a page listed in gateway.cors_allow_origins (none by default)
        if origin is not None:
            if is_preflight(scope):
                await self.cors.preflight(scope, origin, send)
                return
            send = Cors.readable(send, origin)
        try:
            await handler_for(scope["method"], scope["path"])(self, scope, receive, send)
        except GatewayError as e:
            body = tei_error_body(e) if scope["path"] in TEI_PATHS else e.body()  # TEI's shape on TEI's routes
            await respond(send, e.status, body, headers=e.headers())

    # ------------------------------------------------------------------ one proxied request

    async def proxied(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        await serve_request(self.tracing, scope, path, lambda rq: self.handle(scope, receive, send, path, rq))

    async def handle(self, scope: Scope, receive: Receive, send: Send, path: str, rq: GatewayRequest) -> None:
        """A proxied request, step by step. A step that refuses it raises a GatewayError (an OpenAI error)."""
        t0 = time.monotonic()
        inbound = self.regions.inbound(scope) if self.regions is not None else None  # another region's gateway
        key = None if inbound is not None else await self.authenticate(scope)
        await self.check_budget(key)
        body = await read_body(scope, receive, self.fleet.gateway.max_body_bytes)  # 413 while reading
        if inbound is not None:
            self.regions.verify(inbound, path, body)  # signed with the regions' secret, or 401
        if path in DEFAULT_MODEL_PATHS:
            body = with_default_model(body, path, self.kinds)  # no model named: the one serving the route
        req = ProxiedRequest.parse(path, body, self.fleet.gateway.default_max_tokens)
        rt = self.model_for(req, key)
        if inbound is None and path not in TOKENIZER_PATHS:  # a forwarded request passed them where it arrived
            await self.input_guardrails(rt, req)
        self.log_request(rt, req)
        await self.take_limits(key, rt, req)
        # A client that leaves while its request is queued, or before a non-streamed answer, ends it: its
        # queue place, admission slot and upstream request (the replica, or another region, aborts it) are
        # freed at once.
        gone = asyncio.ensure_future(client_gone(receive))
        try:
            if self.regions is not None and await serve_elsewhere(self, rt, req, key, scope, rq, t0, inbound,
                                                                  gone, send):
                return
            async with self.admitted(rt, key, scope, rq, req, gone):
                if rt.activator is not None and not rt.has_live_upstream():  # held for a cold start: watched
                    await unless_gone_or_499(self.wait_for_replica(rt, key), gone)
                call = rq.call = self.route(rt, req, key, scope, rq, t0)
                if self.regions is not None:  # x-argosy-region; another region if every replica here fails
                    regional(self, call, rt, req, key, scope, inbound)
                await self.forward(rt, call, key, req, gone, send)
        finally:
            gone.cancel()
        self.log_response(rt, call)

    async def authenticate(self, scope: Scope) -> KeyRecord | None:
        rec = await self.auth.request_key(scope)  # 401, or 429 for an address with many failures
        if rec is None:  # no keys configured: loopback only (checked at startup), no key needed...
            if self.loopback_only and header(scope, b"origin") is not None:  # ...but no web page may use it
                # (admin.refuse_web_pages); a browser names the page in Origin on every POST, its own too
                admin.refuse_web_pages(scope, "without API keys this gateway answers only this machine's own "
                                              "clients, not web pages", "cross_origin")
            return None
        if rec.expired():
            raise GatewayError(401, f"the API key {rec.name!r} has expired", "authentication_error", "key_expired")
        return rec

    async def check_budget(self, key: KeyRecord | None) -> None:
        """429 insufficient_quota once a key's spend reached its budget (as OpenAI answers a spent quota)."""
        if key is None or key.budget_usd is None:
            return
        spent = (await self.limiter.get_usage(key.name))["spend_micro_usd"] / 1e6
        if spent >= key.budget_usd:
            raise GatewayError(429, f"the API key {key.name!r} has spent its budget ({usd(spent)} of "
                               f"{usd(key.budget_usd)})", "insufficient_quota", "insufficient_quota")

    def model_for(self, req: ProxiedRequest, key: KeyRecord | None) -> ModelRuntime:
        rt = self.models.get(req.model)
        if rt is None:
            raise GatewayError(404, f"the model {req.model!r} does not exist", "not_found_error", "model_not_found",
                               "model")
        if key is not None and key.models is not None and req.model not in key.models:
            raise GatewayError(403, f"this key may not use the model {req.model!r}", "permission_error",
                               "model_not_allowed", "model")
        check_endpoint(rt.name, rt.cfg.kind, req.path)  # 424 for an endpoint its kind does not serve
        if rt.cfg.kind == "rerank":  # a cross-encoder reads the query once per document
            _, req.prompt_tokens, _ = encoder_prompt(req.path, req.fields, "rerank")
            req.estimate = req.prompt_tokens
        return rt

    async def input_guardrails(self, rt: ModelRuntime, req: ProxiedRequest) -> None:
        if rt.guardrails is not None and rt.guardrails.input:
            new = await rt.guardrails.check_input(req.texts, req.prompt_tokens)  # raises when blocked
            if new != req.texts:
                req.set_texts(new)

    def log_request(self, rt: ModelRuntime, req: ProxiedRequest) -> None:
        if self.log_content or rt.cfg.debug:
            log.info("request model=%s body=%s", rt.name, req.body[:4000].decode(errors="replace"))

    async def take_limits(self, key: KeyRecord | None, rt: ModelRuntime, req: ProxiedRequest) -> None:
        """The key's requests/min and tokens/min buckets (the estimate is reserved, reconciled in account)."""
        if key is not None and (key.rpm or key.tpm):
            wait = await self.limiter.take(key.name, key.rpm, key.tpm, min(req.estimate, key.tpm or req.estimate))
            if wait > 0:
                self.m.rejections.labels(rt.name, "rate_limit", key.priority).inc()
                limits = ", ".join(f"{n} {v}" for n, v in (("rpm", key.rpm), ("tpm", key.tpm)) if v)
                raise rate_limited(f"key {key.name!r} is over its rate limit ({limits})",
                                   "rate_limit_exceeded", wait)

    @contextlib.asynccontextmanager
    async def admitted(self, rt: ModelRuntime, key: KeyRecord | None, scope: Scope, rq: GatewayRequest,
                       req: ProxiedRequest, gone: asyncio.Future) -> AsyncIterator[None]:
        """Holds one of the model's admission slots (interactive before batch) for the block: released
        however the block ends (an answer, an error, a cancelled or disconnected client)."""
        prio = PRIORITY.get(key.priority if key else "interactive", 0)
        if header(scope, b"x-priority") == b"batch":
            prio = PRIORITY["batch"]  # a caller may lower its own priority, never raise it
        span = rq.trace.child("gateway.admission", {"argosy.priority": prio}) if rq.trace else None
        rt.tokens_in_flight += req.estimate  # queued or admitted: what metric tokens scales on
        try:
            # A free slot is taken at once; only a queued request is watched for its client leaving (a task).
            waited = 0.0 if rt.admission.try_acquire() else await unless_gone_or_499(rt.admission.acquire(prio), gone)
        except BaseException as e:
            rt.tokens_in_flight -= req.estimate
            if isinstance(e, GatewayError):
                self.m.rejections.labels(rt.name, e.code, key_class(key)).inc()
                if key is not None and key.tpm:
                    await self.limiter.adjust(key.name, key.tpm, min(req.estimate, key.tpm))  # not served: refund
            raise
        finally:
            if span is not None:
                span.end()
        try:
            self.m.queue_wait.labels(rt.name).observe(waited)
            yield
        finally:
            rt.admission.release()
            rt.tokens_in_flight -= req.estimate

    async def wait_for_replica(self, rt: ModelRuntime, key: KeyRecord | None) -> None:
        """Held (bounded) while the model has no live replica but the controller is starting one: scale from
        zero, or a one-replica model's rolling upgrade. Before routing, so the request goes where one is."""
        if rt.activator is None:
            return
        try:
            await rt.activator()
        except GatewayError as e:
            self.m.rejections.labels(rt.name, e.code, key_class(key)).inc()
            raise

    def route(self, rt: ModelRuntime, req: ProxiedRequest, key: KeyRecord | None, scope: Scope,
              rq: GatewayRequest, t0: float) -> Call:
        """The revision (traffic split, sticky per session; a rollout's candidate when the request names it)
        and everything the proxy needs for the call."""
        sess = header(scope, rt.cfg.routing.session_header.lower().encode())
        sess_key = sess.decode(errors="replace") if sess else req.user
        wanted = header(scope, rt.cfg.rollout.revision_header.lower().encode()) if rt.selectable else None
        revision, router = rt.pick(sess_key, wanted.decode(errors="replace") if wanted else None)
        rreq = RouteRequest(req.text, req.prompt_tokens, sess_key)
        generates = req.path not in TOKENIZER_PATHS
        shadow_out = self.shadower.maybe_start(rt, req.path, req.fields, rreq, revision) if generates else None
        billed = key is not None  # a key's usage and spend come from the answer's usage where it has one
        keep = (shadow_out is not None or billed and not req.stream or rt.cfg.debug
                or rt.recording and generates and not req.stream)  # a rollout's samples count the answer's tokens
        return Call(rt.name, revision, req.path, req.body, req.stream, rreq, req.estimate, router, t0,
                    rt.output_guard, keep_output=keep, trace=rq.trace, headers=rq.upstream_headers,
                    request_id=rq.request_id, shadow_out=shadow_out, fallback=rt.fallback_for(revision),
                    gaps=[] if rt.recording and req.stream else None, recorded=rt.recording and generates)

    async def forward(self, rt: ModelRuntime, call: Call, key: KeyRecord | None, req: ProxiedRequest,
                      gone: asyncio.Future, send: Send) -> None:
        """Proxy the request; record the outcome (and, during a rollout, its sample for the analysis)."""
        try:
            if call.stream:  # the stream checks `gone` between chunks
                await self.proxy.forward(call, send, gone)
            else:
                await unless_gone_or_499(self.proxy.forward(call, send, None), gone)
        except GatewayError as e:
            self.m.rejections.labels(rt.name, e.code, key_class(key)).inc()
            call.status = e.status
            raise
        finally:
            self.m.requests.labels(rt.name, call.route, call.upstream, str(call.status), key_class(key)).inc()
            self.m.e2e.labels(rt.name, call.route, call.upstream).observe(time.monotonic() - call.t0)
            if call.shadow_out is not None and not call.shadow_out.done():
                call.shadow_out.set_result((call.output, call.stream))
            if call.recorded and not 400 <= call.status < 500:
                rt.stats.add(RequestSample(time.monotonic(), call.route, LIVE, call.status != 200,
                                           time.monotonic() - call.t0, call.ttft, call.gaps,
                                           output_tokens(call.stream, call.completion_events, call.output)))
            await account(self.limiter, key, call, req, self.prices, rt.cfg.kind if req.path in ENCODER_PATHS else None)

    def log_response(self, rt: ModelRuntime, call: Call) -> None:
        if rt.cfg.debug or self.log_content:
            log.info("response model=%s status=%s body=%s", rt.name, call.status,
                     b"".join(call.output)[:4000].decode(errors="replace"))

