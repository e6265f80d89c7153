"""The live dashboard, served by the gateway (docs/observe.md).

    GET /dashboard            the page (argosy/observe/static/index.html); it polls /dashboard/data every 2 s
    GET /dashboard/data       JSON: models, replicas with state and load, autoscaler decisions, rollouts and
                              shadow agreement (docs/rollouts.md), time series, each API key's usage and spend
                              (the admin key when the gateway listens beyond loopback: it names replicas and keys)
    GET /dashboard/<file>     the page's script and styles and the vendored uPlot (MIT), from the package

Charts come from uPlot, vendored into argosy/observe/static/ (no CDN: a fleet often has no internet). The
time series are argosy.observe.sampler's; the replicas' gauges come from the gateway's ReplicaScraper.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import argosy.observe
from argosy.gateway.admin import require_admin_beyond_loopback
from argosy.gateway.asgi import Receive, Scope, Send, respond
from argosy.gateway.errors import not_found
from argosy.observe.sampler import HISTORY, MIN_INTERVAL_S

if TYPE_CHECKING:
    from argosy.gateway.app import Gateway

STATIC = Path(argosy.observe.__file__).parent / "static"
TYPES = {".html": b"text/html; charset=utf-8", ".js": b"text/javascript; charset=utf-8",
         ".css": b"text/css; charset=utf-8"}


async def page(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await respond(send, 200, (STATIC / "index.html").read_bytes(), TYPES[".html"])


async def static_file(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    name = scope["path"].removeprefix("/dashboard/")
    f = STATIC / name
    if "/" in name or f.suffix not in TYPES or not f.is_file():  # only the package's own files
        raise not_found(f"no dashboard file {name!r}")
    await respond(send, 200, f.read_bytes(), TYPES[f.suffix])


async def data(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await require_admin_beyond_loopback(gw, scope)  # it lists replica URLs and key names; the page itself stays open
    body = await snapshot(gw)
    body["keys"] = await key_usage(gw)
    await respond(send, 200, json.dumps(body).encode())


async def key_usage(gw: Gateway) -> list[dict[str, Any]]:
    """Each API key: requests, input and output tokens, spend (the price book's served_prices), budget."""
    out = []
    for k in sorted(gw.keys.by_id.values(), key=lambda k: k.name):
        u = await gw.limiter.get_usage(k.name)
        out.append({"name": k.name, "requests": u["requests"], "input_tokens": u["input_tokens"],
                    "output_tokens": u["output_tokens"], "spend_usd": u["spend_micro_usd"] / 1e6,
                    "budget_usd": k.budget_usd, "expires_at": k.expires_at})
    return out


async def snapshot(gw: Gateway) -> dict[str, Any]:
    sampler = gw.sampler
    models = model_table(gw)

    async def replica_gauges(urls: list[str]) -> dict[str, dict[str, float]]:
        got = await gw.scraper.refresh(urls, max_age=MIN_INTERVAL_S)
        return {u: {"kv": g.kv_usage, "waiting": g.waiting, "running": g.running,
                    **{k: v for k, v in (("busy", g.device_busy), ("memory", g.device_memory),
                                         ("throttled", g.throttled)) if v is not None}}
                for u, g in got.items()}

    await sampler.sample({m["model"]: [r["url"] for r in m["replicas"] if r["url"]] for m in models}, replica_gauges)
    gauges = sampler.last.replicas if sampler.last else {}
    for m in models:
        for r in m["replicas"]:
            g = gauges.get(r["url"] or "", {})
            r["kv_cache_usage"], r["waiting"], r["running"] = g.get("kv"), g.get("waiting"), g.get("running")
            r["device_busy"], r["device_memory"], r["throttled"] = g.get("busy"), g.get("memory"), g.get("throttled")
    return {"now": time.time(), "poll_s": 2.0, "history_points": HISTORY, "models": models,
            "decisions": decisions(gw), "rollouts": gw.fleet_view.rollout_status() if gw.fleet_view else [],
            "shadow": gw.shadower.pairs.report(), **sampler.series()}


def model_table(gw: Gateway) -> list[dict[str, Any]]:
    """Each model with its replicas (state, in flight): the controller's view under `argosy serve`,
    else the upstreams the gateway routes to (state = the breaker's)."""
    fleet = gw.fleet_view
    managed = {} if fleet is None else {mc["model"]: mc for mc in fleet.status()["models"]}
    out = []
    for name, rt in gw.models.items():
        st = managed.get(name)
        if st is not None:
            replicas = [{"id": r["id"], "revision": r.get("revision"), "state": r["state"], "pooled": r["pooled"],
                         "url": r["url"],
                         "node": r["node"], "in_flight": r["in_flight"], "age_s": r["age_s"],
                         "cold_start_s": r["cold_start_s"], "region": r.get("region"), "provider": r.get("provider"),
                         "capacity_kind": r.get("capacity_kind"), "usd_per_hour": r.get("usd_per_hour")}
                        for r in st["replicas"]]
        else:
            replicas = [{"id": u.url, "state": "ready" if u.state == "closed" else f"breaker {u.state}",
                         "pooled": False, "url": u.url, "node": None, "in_flight": u.in_flight, "age_s": None,
                         "cold_start_s": None} for u in rt.upstreams()]
        load = rt.admission_load()
        out.append({"model": name, "managed": st is not None, "desired": st["desired"] if st else None,
                    "ready": sum(1 for r in replicas if r["state"] == "ready" and not r["pooled"]),
                    "in_flight": load.in_flight, "queued": load.waiting,
                    "held": st["held"] if st else 0, "panic": bool(st and st["panic"]),
                    "unplaceable": st["unplaceable"] if st else None, "replicas": replicas})
    return out


def decisions(gw: Gateway) -> list[dict[str, Any]]:
    """The autoscaler's recent decisions that changed something (up to 20 per model), oldest first."""
    if gw.fleet_view is None:
        return []
    keep = ("model", "at", "direction", "actual", "desired", "ready", "panic", "reason")
    return [{k: d.get(k) for k in keep} for d in gw.fleet_view.decisions()]
