"""The live dashboard, served by the gateway (docs/observe.md).

    GET /dashboard            the page (static/index.html); it polls /dashboard/data every 2 s
    GET /dashboard/data       JSON: models, replicas with state and load, autoscaler decisions, time series
    GET /dashboard/<file>     the page's script and styles and the vendored uPlot (MIT), from the package

Charts come from uPlot, vendored into static/ (no CDN: a fleet often has no internet).
"""

from __future__ import annotations

import json
import time
import weakref
from pathlib import Path
from typing import Any

from argosy.gateway.app import respond
from argosy.gateway.errors import GatewayError
from argosy.observe.sampler import HISTORY, Sampler

STATIC = Path(__file__).parent / "static"
TYPES = {".html": b"text/html; charset=utf-8", ".js": b"text/javascript; charset=utf-8",
         ".css": b"text/css; charset=utf-8"}
_samplers: weakref.WeakKeyDictionary[Any, Sampler] = weakref.WeakKeyDictionary()


async def handle(gw: Any, send: Any, path: str) -> None:
    if path in ("/dashboard", "/dashboard/"):
        return await respond(send, 200, (STATIC / "index.html").read_bytes(), TYPES[".html"])
    if path == "/dashboard/data":
        return await respond(send, 200, json.dumps(await data(gw)).encode())
    name = path.removeprefix("/dashboard/")
    f = STATIC / name
    if "/" in name or f.suffix not in TYPES or not f.is_file():  # only the package's own files
        raise GatewayError(404, f"no dashboard file {name!r}", "not_found_error", "not_found")
    await respond(send, 200, f.read_bytes(), TYPES[f.suffix])


async def data(gw: Any) -> dict[str, Any]:
    sampler = _samplers.get(gw)
    if sampler is None:
        sampler = _samplers[gw] = Sampler(gw)
    models = model_table(gw)
    await sampler.sample({m["model"]: [r["url"] for r in m["replicas"] if r["url"]] for m in models})
    gauges = sampler.last.replicas if sampler.last else {}
    for m in models:
        for r in m["replicas"]:
            g = gauges.get(r["url"] or "", {})
            r["kv_cache_usage"], r["waiting"], r["running"] = g.get("kv"), g.get("waiting"), g.get("running")
    return {"now": time.time(), "poll_s": 2.0, "history_points": HISTORY, "models": models,
            "decisions": decisions(gw), **sampler.series()}


def model_table(gw: Any) -> list[dict[str, Any]]:
    """Each model with its replicas (state, in flight): the controller's view under `argosy serve`,
    else the upstreams the gateway routes to (state = the breaker's)."""
    controller = getattr(gw, "controller", None)
    managed = {} if controller is None else {mc["model"]: mc for mc in controller.status()["models"]}
    out = []
    for name, rt in gw.models.items():
        st = managed.get(name)
        if st is not None:
            replicas = [{"id": r["id"], "state": r["state"], "pooled": r["pooled"], "url": r["url"],
                         "node": r["node"], "in_flight": r["in_flight"], "age_s": r["age_s"],
                         "cold_start_s": r["cold_start_s"]} for r in st["replicas"]]
        else:
            replicas = [{"id": u.url, "state": "ready" if u.state == "closed" else f"breaker {u.state}",
                         "pooled": False, "url": u.url, "node": None, "in_flight": u.in_flight, "age_s": None,
                         "cold_start_s": None} for u in rt.upstreams()]
        out.append({"model": name, "managed": st is not None, "desired": st["desired"] if st else None,
                    "ready": sum(1 for r in replicas if r["state"] == "ready" and not r["pooled"]),
                    "in_flight": rt.admission.in_flight, "queued": rt.admission.waiting,
                    "held": st["held"] if st else 0, "panic": bool(st and st["panic"]),
                    "unplaceable": st["unplaceable"] if st else None, "replicas": replicas})
    return out


def decisions(gw: Any) -> list[dict[str, Any]]:
    """The autoscaler's recent decisions that changed something (up to 20 per model), oldest first."""
    controller = getattr(gw, "controller", None)
    if controller is None:
        return []
    keep = ("model", "at", "direction", "actual", "desired", "ready", "panic", "reason")
    return [{k: d.get(k) for k in keep} for mc in controller.models.values() for d in list(mc.decisions)]
