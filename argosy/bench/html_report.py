"""The self-contained HTML report: summaries, and inline SVG charts per run (latency over time, output
throughput over time, CDFs of TTFT / ITL / E2EL) and, for a sweep, throughput and goodput versus load."""

from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path

from argosy.bench.results import render_run, render_sweep
from argosy.bench.svg import Series, cdf, chart

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1200px; }
pre { background: #f6f6f6; padding: 10px; overflow-x: auto; font-size: 13px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
svg.chart { background: #fff; border: 1px solid #ddd; font-size: 11px; }
svg.chart .title { font-size: 13px; font-weight: 600; }
svg.chart .grid { stroke: #eee; }
table { border-collapse: collapse; font-size: 13px; } td { padding: 2px 10px 2px 0; vertical-align: top; }
"""


def _latency_over_time(run: dict) -> str:
    ok = [r for r in run["records"] if r.ok]
    series = [Series("E2EL", [r.sent_s for r in ok], [r.e2e_s * 1000 for r in ok]),
              Series("TTFT", [r.sent_s for r in ok], [r.ttft_s * 1000 for r in ok])]
    failed = [r for r in run["records"] if not r.ok]
    if failed:
        series.append(Series("failed (time to failure)", [r.sent_s for r in failed],
                             [((r.finished_s or r.sent_s) - r.sent_s) * 1000 for r in failed], "#000"))
    return chart(series, "Latency over time", "request sent at (s)", "latency (ms)", kind="scatter")


def _throughput_over_time(run: dict) -> str:
    ok = [r for r in run["records"] if r.ok]
    times = [r.sent_s + t for r in ok for t in r.chunk_times_s]
    if not times:
        return chart([], "Output throughput over time", "time (s)", "tok/s")
    end = max(times)
    bucket = max(0.5, end / 60)  # about 60 points whatever the run's length
    counts = [0.0] * (math.floor(end / bucket) + 1)
    for t in times:
        counts[math.floor(t / bucket)] += 1
    # Chunks, not tokens: scale by tokens per chunk so a server that batches tokens per chunk adds up.
    per_chunk = sum(r.num_output_tokens for r in ok) / len(times)
    xs = [(i + 0.5) * bucket for i in range(len(counts))]
    return chart([Series("output tokens", xs, [c * per_chunk / bucket for c in counts])],
                 "Output throughput over time", "time (s)", "tok/s")


def _cdfs(run: dict) -> list[str]:
    ok = [r for r in run["records"] if r.ok]
    out = []
    for title, values in (("TTFT", [r.ttft_s * 1000 for r in ok]),
                          ("ITL", [g * 1000 for r in ok for g in r.itls_s]),
                          ("E2EL", [r.e2e_s * 1000 for r in ok])):
        xs, ys = cdf(values) if values else ([], [])
        out.append(chart([Series(title, xs, ys)], f"CDF of {title}", f"{title} (ms)", "fraction of "
                         + ("gaps" if title == "ITL" else "requests"), y_min=0.0))
    return out


def _sweep_charts(sweep: dict) -> list[str]:
    x = sweep["x"]
    pts = sweep["points"]
    xs = [p[x] for p in pts]
    x_label = "request rate (req/s)" if x == "rate" else "concurrency (requests)"
    series = [Series("throughput", xs, [p["request_throughput_rps"] for p in pts])]
    if pts[0]["goodput_rps"] is not None:
        series.append(Series("goodput", xs, [p["goodput_rps"] for p in pts]))
    charts = [chart(series, f"Throughput and goodput vs {x}", x_label, "req/s"),
              chart([Series("output tokens", xs, [p["output_throughput_tps"] for p in pts])],
                    f"Output token throughput vs {x}", x_label, "tok/s")]
    if pts[0]["slo_attainment"] is not None:
        charts.append(chart([Series("met the SLOs", xs, [100 * p["slo_attainment"] for p in pts]),
                             Series(f"{round(100 * sweep['attainment_target'])} % target", xs,
                                    [100 * sweep["attainment_target"]] * len(xs), "#999")],
                            f"SLO attainment vs {x}", x_label, "% of requests"))
    return charts


def render_html(result: dict) -> str:
    cfg = result["config"]
    rows = "".join(f"<tr><td>{escape(str(k))}</td><td>{escape(json.dumps(v))}</td></tr>"
                   for k, v in cfg.items())
    body = [f"<h1>argosy bench: {escape(str(cfg.get('model', '')))} at {escape(str(cfg.get('url', '')))}</h1>",
            f"<p>Run {escape(result.get('created', ''))}. Metric definitions: vLLM's benchmark_serving "
            "(TTFT; TPOT excludes the first token; ITL is every gap between token-carrying chunks; E2EL).</p>",
            f"<details><summary>Configuration</summary><table>{rows}</table></details>"]
    if result.get("sweep"):
        body.append("<h2>Sweep</h2><div class=charts>" + "".join(_sweep_charts(result["sweep"])) + "</div>")
        body.append(f"<pre>{escape(render_sweep(result['sweep']))}</pre>")
    for run in result["runs"]:
        body.append(f"<h2>{escape(run['label'])}</h2><pre>{escape(render_run(run))}</pre>")
        body.append("<div class=charts>" + _latency_over_time(run) + _throughput_over_time(run)
                    + "".join(_cdfs(run)) + "</div>")
    return (f"<!doctype html><html><head><meta charset=utf-8><title>argosy bench report</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>")


def write_html(result: dict, path: str | Path) -> None:
    Path(path).write_text(render_html(result))
