"""`GET /metrics/targets`: the replicas to scrape, in Prometheus' HTTP service-discovery format.

    [{"targets": ["127.0.0.1:41235"], "labels": {"model": "tiny", "replica": "r3"}}, ...]

Every upstream the gateway routes to (fixed `upstreams:` too) and, under `argosy serve`, every replica
the controller runs that listens (warming, ready, draining; warm-pool ones included), so Prometheus
follows scale-ups and scale-downs without a restart (deploy/prometheus/prometheus.yml). No `state`
label: a target's labels name its series, and a replica going warming -> ready must stay one series.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit


def replica_targets(gw: Any) -> list[dict[str, Any]]:
    """(url, model, replica id, state) rows: the controller's replicas first, then the routing sets."""
    rows: dict[str, dict[str, Any]] = {}
    controller = getattr(gw, "controller", None)
    if controller is not None:
        for name, mc in controller.models.items():
            for r in list(mc.replicas.values()):
                if r.url and r.state in ("warming", "ready", "draining"):
                    rows[r.url] = {"url": r.url, "model": name, "replica": r.id, "state": r.state,
                                   "pooled": r.pooled}
    for name, rt in gw.models.items():
        for u in rt.upstreams():
            rows.setdefault(u.url, {"url": u.url, "model": name, "replica": "", "state": u.state,
                                    "pooled": False})
    return list(rows.values())


def http_sd(gw: Any) -> bytes:
    groups = []
    for row in replica_targets(gw):
        parts = urlsplit(row["url"])
        labels = {"model": row["model"], "replica": row["replica"] or parts.netloc}
        if parts.scheme == "https":
            labels["__scheme__"] = "https"
        if parts.path.strip("/"):
            labels["__metrics_path__"] = parts.path.rstrip("/") + "/metrics"
        groups.append({"targets": [parts.netloc], "labels": labels})
    return json.dumps(groups).encode()
