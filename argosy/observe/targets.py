"""`GET /metrics/targets`: the replicas to scrape, in Prometheus' HTTP service-discovery format.

    [{"targets": ["127.0.0.1:41235"], "labels": {"model": "tiny", "replica": "r3"}}, ...]

The gateway lists the rows (argosy.gateway.endpoints): every upstream it routes to (fixed `upstreams:`
too) and, under `argosy serve`, every replica the controller runs that listens (warming, ready, draining;
warm-pool ones included), so Prometheus follows scale-ups and scale-downs without a restart
(deploy/prometheus/prometheus.yml). No `state` label: a target's labels name its series, and a replica
going warming -> ready must stay one series.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit


def http_sd(rows: list[dict[str, Any]]) -> bytes:
    """Rows {url, model, replica} as HTTP SD target groups (`replica` defaults to the address)."""
    groups = []
    for row in rows:
        parts = urlsplit(row["url"])
        labels = {"model": row["model"], "replica": row["replica"] or parts.netloc}
        if parts.scheme == "https":
            labels["__scheme__"] = "https"
        if parts.path.strip("/"):
            labels["__metrics_path__"] = parts.path.rstrip("/") + "/metrics"
        groups.append({"targets": [parts.netloc], "labels": labels})
    return json.dumps(groups).encode()
