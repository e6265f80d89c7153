"""One request's trip to another region, as a step of Gateway.handle (docs/regions.md).

The request is signed and sent to the chosen region's gateway through the same proxy as any upstream
call: it streams end to end, carries the trace context (traceparent) and its request id, and is retried
on the next region if that one fails before the first byte. When every region it may go to failed
before answering, home serves it if it can (it returns here and Gateway.handle goes on); otherwise the
caller gets the 503 with Retry-After. And the other way round: a request served at home whose every local
replica fails before its first byte goes on to the best other region (`regional`), in the same call.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from argosy.gateway.accounting import account, key_class
from argosy.gateway.errors import GatewayError
from argosy.gateway.proxy import Call, unless_gone_or_499
from argosy.gateway.regions.service import Inbound, PeerRoute
from argosy.gateway.regions.upstream import HOME_URL
from argosy.gateway.router import RouteRequest

if TYPE_CHECKING:
    from argosy.gateway.app import Gateway
    from argosy.gateway.asgi import Scope, Send
    from argosy.gateway.bodies import ProxiedRequest
    from argosy.gateway.keys import KeyRecord
    from argosy.gateway.traffic import ModelRuntime
    from argosy.observe.gateway_requests import GatewayRequest


async def serve_elsewhere(gw: Gateway, rt: ModelRuntime, req: ProxiedRequest, key: KeyRecord | None,
                          scope: Scope, rq: GatewayRequest, t0: float, inbound: Inbound | None,
                          gone: asyncio.Future, send: Send) -> bool:
    """True when another region answered the request; False when home serves it. A client that leaves
    (`gone`) ends the call there too: its connection to the other region's gateway is dropped."""
    regions = gw.regions
    residency = inbound.residency if inbound is not None else regions.residency(scope, key and key.residency)
    rreq = RouteRequest(req.text, req.prompt_tokens, None, residency=residency)
    home_live = regions.observe_home(rt)
    try:
        target, reason = regions.place(rt.name, rreq, inbound, home_live)
    except GatewayError as e:
        gw.region_metrics.requests.labels(rt.name, "none", "refused").inc()
        gw.m.rejections.labels(rt.name, e.code, key_class(key)).inc()
        raise
    if target is None:
        gw.region_metrics.requests.labels(rt.name, regions.name, reason).inc()
        return False
    mr = regions.models[rt.name]
    headers = regions.forward_headers(rq.upstream_headers, req.path, req.body, residency, key and key.name)
    keep = bool(key and key.tpm) and not req.stream or rt.cfg.debug
    call = rq.call = Call(rt.name, f"region:{target.region}", req.path, req.body, req.stream, rreq, req.estimate,
                          PeerRoute(mr, target), t0, None, keep_output=keep, trace=rq.trace, headers=headers,
                          request_id=rq.request_id)
    try:
        if call.stream:  # the stream checks `gone` up to its first chunk and between chunks
            await gw.proxy.forward(call, send, gone)
        else:
            await unless_gone_or_499(gw.proxy.forward(call, send, None), gone)
    except GatewayError as e:
        if e.status == 503 and regions.home_can_serve(mr.home, rreq, rt.has_live_upstream()):
            gw.region_metrics.requests.labels(rt.name, regions.name, "fallback").inc()
            rq.call = None
            return False  # nothing was sent: home serves it after all
        call.status = e.status
        gw.m.rejections.labels(rt.name, e.code, key_class(key)).inc()
        raise
    finally:
        if rq.call is not None:
            served = call.upstream and next((u.region for u in mr.candidates if u.url == call.upstream), "none")
            gw.region_metrics.requests.labels(rt.name, served or "none", reason).inc()
            gw.m.requests.labels(rt.name, call.route, call.upstream, str(call.status), key_class(key)).inc()
            gw.m.e2e.labels(rt.name, call.route, call.upstream).observe(time.monotonic() - call.t0)
            await account(gw.limiter, key, call, req, gw.prices)
    return True


def regional(gw: Gateway, call: Call, rt: ModelRuntime, req: ProxiedRequest, key: KeyRecord | None, scope: Scope,
             inbound: Inbound | None) -> None:
    """A call served at home: says so (x-argosy-region) and, unless it was forwarded here (one hop), may
    fail over to another region when no local replica is left to try."""
    regions = gw.regions
    call.reply_headers = regions.here_headers
    if inbound is not None:
        return
    residency = regions.residency(scope, key and key.residency)

    def failover(c: Call) -> bool:
        mr = regions.models[rt.name]
        if not regions.observe_home(rt):
            mr.home.health.fail(at_once=True)
        rreq = RouteRequest(c.rreq.prompt_text, c.rreq.prompt_tokens, None, residency=residency)
        target = mr.choose(rreq, {HOME_URL})
        if target is None:
            return False
        c.router, c.rreq, c.route, c.guard = PeerRoute(mr, target), rreq, f"region:{target.region}", None
        c.headers = regions.forward_headers(c.headers, req.path, req.body, residency, key and key.name)
        c.reply_headers = []  # the region that answers names itself
        gw.region_metrics.requests.labels(rt.name, target.region, "failover").inc()
        return True

    call.failover = failover
