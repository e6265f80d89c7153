"""Self-contained HTML for `argosy sim` / `argosy sim --week` / `argosy plan`, with the bench's inline SVG charts."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from argosy.bench.html_report import STYLE
from argosy.bench.svg import Series, chart


def _page(title: str, summary: str, charts: list[str], data: dict) -> str:
    body = "\n".join(charts)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1><pre>{escape(summary)}</pre>"
            f"<div class='charts'>{body}</div><details><summary>result JSON</summary><pre>"
            f"{escape(json.dumps(data, indent=1)[:200_000])}</pre></details></body></html>")


def run_charts(res: dict) -> list[str]:
    tl = res.get("timeline") or []
    xs = [row["t"] for row in tl]
    regions = list(tl[0]["replicas"]) if tl else []
    reps = [Series(r, xs, [row["replicas"][r] for row in tl]) for r in regions]
    return [chart(reps, "Ready replicas over time", "time (s)", "replicas"),
            chart([Series("waiting", xs, [row["queue"] for row in tl]),
                   Series("running", xs, [row["running"] for row in tl])],
                  "Queue depth and running requests", "time (s)", "requests")]


def week_charts(res: dict) -> list[str]:
    lv = sorted(res["levels"], key=lambda x: (x["rate_rps"], len(x["down"])))
    ok = [x for x in lv if not x["down"]]
    hours = sorted((h, x) for x in res["levels"] for h in x["hours_of_week"])
    return [chart([Series("req/s", [h for h, _ in hours], [x["rate_rps"] for _, x in hours])],
                  "Load over the week", "hour of the week", "req/s"),
            chart([Series("GPUs (avg)", [h for h, _ in hours], [x["gpu_hours_per_hour"] for _, x in hours])],
                  "GPUs in use over the week", "hour of the week", "GPUs"),
            chart([Series("p99 TTFT", [x["rate_rps"] for x in ok], [(x["ttft_p99_s"] or 0) * 1000 for x in ok]),
                   Series("p99 TPOT", [x["rate_rps"] for x in ok], [(x["tpot_p99_s"] or 0) * 1000 for x in ok])],
                  "Latency by load level", "req/s", "ms")]


def plan_charts(res: dict) -> list[str]:
    """The frontier on log axes with the SLO line, each GPU type's best, and the load curve of the choice."""
    cands = res["candidates"]
    key = "usd_per_hour" if cands and all(c.get("usd_per_hour") is not None for c in cands) else "gpus"
    xlabel = "$ per hour (log)" if key == "usd_per_hour" else "GPUs (log)"
    front = res["frontier"]
    slo_ms = (res["slo"].get("ttft_s") or 0) * 1000
    hl = ((slo_ms, f"TTFT SLO {slo_ms:g} ms"),) if slo_ms else ()
    pts = lambda cs: ([c[key] for c in cs], [(c["ttft_p99_s"] or 0) * 1000 for c in cs])  # noqa: E731
    charts = [chart([Series("meets the SLO", *pts([c for c in cands if c.get("met")]), "#2ca02c"),
                     # one stopped once it had certainly failed has no p99 TTFT to draw
                     Series("misses it", *pts([c for c in cands if not c.get("met") and c["ttft_p99_s"] is not None]),
                            "#999999"),
                     Series("frontier", *pts(front), "#1f77b4")],
                    "Cost against p99 TTFT", xlabel, "p99 TTFT (ms, log)", kind="scatter", log_x=True, log_y=True,
                    hlines=hl)]
    best = (res.get("answer") or {}).get("by_gpu") or []
    if best:
        charts.append(chart([Series(f"{b['gpu']} TP{b['tp']} ({b['gpus']} GPUs)", *pts([b])) for b in best],
                            "Each GPU type's cheapest passing fleet", xlabel, "p99 TTFT (ms, log)", kind="scatter",
                            log_x=True, log_y=True, hlines=hl))
    tl = res.get("load_curve") or []
    if tl:
        xs = [row["t"] for row in tl]
        charts.append(chart([Series("running", xs, [row["running"] for row in tl]),
                             Series("waiting", xs, [row["queue"] for row in tl])],
                            "The chosen fleet under the peak: requests in the system", "time (s)", "requests"))
        charts.append(chart([Series(r, xs, [row["replicas"][r] for row in tl]) for r in tl[0]["replicas"]],
                            "Replicas serving it, by region", "time (s)", "replicas"))
    return charts


def write_html(path: str | Path, title: str, summary: str, res: dict, kind: str) -> None:
    charts = {"run": run_charts, "week": week_charts, "plan": plan_charts}[kind](res)
    Path(path).write_text(_page(title, summary, charts, res))
