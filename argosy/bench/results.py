"""The results file and the text summary.

The JSON holds everything needed to redo the analysis: the config, every request's record (times,
token counts, error kind; never prompt or output text) and the summaries. `load` recomputes the
summaries from the records, so `argosy bench report` (with other SLOs, if asked) renders the same way
as the run did.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from argosy.bench.metrics import ATTAINMENT_TARGET, max_rate_meeting_slos, summarize
from argosy.bench.record import RequestRecord

FORMAT = "argosy-bench/1"


def run_entry(label: str, level: dict[str, Any], records: list[RequestRecord], slos: dict[str, float]) -> dict:
    # Summarise what the file will hold (times rounded to microseconds): `report` then prints the
    # same digits as the run did.
    records = [RequestRecord.from_dict(r.to_dict()) for r in records]
    return {"label": label, **level, "records": records, "summary": summarize(records, slos)}


def sweep_summary(runs: list[dict], slos: dict[str, float]) -> dict | None:
    if len(runs) < 2:
        return None
    x = "rate" if runs[0].get("rate") is not None else "concurrency"
    points = [{x: r.get(x), "request_throughput_rps": r["summary"]["request_throughput_rps"],
               "output_throughput_tps": r["summary"]["output_throughput_tps"],
               "goodput_rps": r["summary"]["goodput_rps"], "slo_attainment": r["summary"]["slo_attainment"]}
              for r in runs]
    best = None
    if slos and x == "rate":
        best = max_rate_meeting_slos([(p["rate"], p["slo_attainment"]) for p in points])
    return {"x": x, "points": points, "attainment_target": ATTAINMENT_TARGET, "max_rate_meeting_slos": best}


def build(config: dict[str, Any], runs: list[dict], slos: dict[str, float]) -> dict:
    return {"format": FORMAT, "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "config": config, "runs": runs, "sweep": sweep_summary(runs, slos)}


def save(result: dict, path: str | Path) -> None:
    def enc(o: Any) -> Any:
        if isinstance(o, RequestRecord):
            return o.to_dict()
        raise TypeError(f"cannot serialise {type(o).__name__}")

    Path(path).write_text(json.dumps(result, default=enc, indent=1))


def load(path: str | Path, slos: dict[str, float] | None = None) -> dict:
    """Read a results file; recompute the summaries (with `slos` instead of the run's, if given)."""
    result = json.loads(Path(path).read_text())
    if result.get("format") != FORMAT:
        raise ValueError(f"{path}: not an argosy bench results file")
    slos = result["config"].get("slo_ms", {}) if slos is None else slos
    for run in result["runs"]:
        run["records"] = [RequestRecord.from_dict(d) for d in run["records"]]
        run["summary"] = summarize(run["records"], slos)
    result["sweep"] = sweep_summary(result["runs"], slos)
    return result


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def render_run(run: dict) -> str:
    s = run["summary"]
    errors = ", ".join(f"{k}: {v}" for k, v in s["errors"].items())
    lines = [f"============ {run['label']} ============"]
    if run.get("interrupted"):
        lines.append(f"Interrupted (Ctrl-C):     the figures are of what finished before it; "
                     f"{run['interrupted']['in_flight']} requests in flight were dropped")
    lines += [f"Requests:                 {s['requests']} sent, {s['completed']} completed, {s['failed']} failed"
              + (f" ({errors})" if errors else ""),
              *(f"  {kind}: {example}" for kind, example in s.get("error_examples", {}).items() if example),
              f"Duration:                 {_f(s['duration_s'])} s",
              f"Request throughput:       {_f(s['request_throughput_rps'])} req/s",
              f"Input token throughput:   {_f(s['input_throughput_tps'], 1)} tok/s"
              f" ({s['total_input_tokens']} tokens)",
              f"Output token throughput:  {_f(s['output_throughput_tps'], 1)} tok/s"
              f" ({s['total_output_tokens']} tokens)",
              f"Total token throughput:   {_f(s['total_token_throughput_tps'], 1)} tok/s"]
    if s["slo_ms"]:
        slo = ", ".join(f"{k}<={v:g} ms" for k, v in s["slo_ms"].items())
        lines.append(f"Goodput ({slo}): {_f(s['goodput_rps'])} req/s;"
                     f" {_f(100 * s['slo_attainment'], 1)} % of requests met the SLOs")
    lines.append(f"{'':16}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    rows = [("TTFT (ms)", s["ttft_ms"]), ("TPOT (ms)", s["tpot_ms"]), ("ITL (ms)", s["itl_ms"]),
            ("E2EL (ms)", s["e2el_ms"])]
    if s["send_lag_ms"]:
        rows.append(("Send lag (ms)", s["send_lag_ms"]))
    for name, st in rows:
        lines.append(f"{name:16}" + "".join(f"{_f(st[k]):>10}" for k in ("mean", "p50", "p90", "p99")))
    lines.append(f"Peak in flight:           {s['peak_in_flight']} requests")
    if run.get("client_cpu_s") is not None and s["duration_s"] and s["requests"]:
        share = 100 * run["client_cpu_s"] / s["duration_s"]  # of a run this short, a share says nothing
        lines.append(f"Client CPU:               {run['client_cpu_s']:.2f} s"
                     + (f" ({share:.0f} % of a core)" if s["duration_s"] >= 1 else ""))
    return "\n".join(lines)


def render_sweep(sweep: dict) -> str:
    x = sweep["x"]
    unit = "req/s" if x == "rate" else "requests"
    head = f"{x + ' (' + unit + ')':>20}{'req/s':>10}{'out tok/s':>12}{'goodput req/s':>15}{'SLO met %':>11}"
    lines = ["============ sweep ============", head]
    for p in sweep["points"]:
        att = p["slo_attainment"]
        lines.append(f"{p[x]:>20g}{_f(p['request_throughput_rps']):>10}{_f(p['output_throughput_tps'], 1):>12}"
                     f"{_f(p['goodput_rps']):>15}{_f(None if att is None else 100 * att, 1):>11}")
    if x == "rate" and sweep["points"][0]["slo_attainment"] is not None:
        best = sweep["max_rate_meeting_slos"]
        pct = round(100 * sweep["attainment_target"])
        lines.append(f"Highest rate with >= {pct} % of requests meeting the SLOs: "
                     + ("none of the rates tested" if best is None else f"{best:g} req/s"))
    return "\n".join(lines)


def render(result: dict) -> str:
    parts = [render_run(r) for r in result["runs"]]
    if result.get("sweep"):
        parts.append(render_sweep(result["sweep"]))
    return "\n\n".join(parts)
