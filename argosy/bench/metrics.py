"""Summary metrics of a run, with vLLM's definitions (vllm/benchmarks/serve.py):

TTFT  time from sending the request to the first chunk carrying tokens
TPOT  per request, (E2EL - TTFT) / (output tokens - 1): the first token excluded
ITL   every gap between two consecutive token-carrying chunks, pooled over all requests
E2EL  time from sending the request to its last token-carrying chunk
Throughputs divide by the run's duration (first send to last response end); goodput is the number
of completed requests meeting every SLO per second, a request with fewer than 2 output tokens counting
TPOT 0. SLO attainment (our addition, for DistServe's "highest rate with >= 90% meeting the SLOs")
divides by all requests sent, so failed requests count against it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from argosy.bench.record import RequestRecord

SLO_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2el", "e2el": "e2el"}
ATTAINMENT_TARGET = 0.9
LATE_SEND_S = 0.010  # a request sent more than 10 ms after its schedule counts as late


def parse_duration_ms(text: str) -> float:
    """'2s', '150ms', '1.5' (bare numbers are milliseconds, as in vLLM's --goodput) -> milliseconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*", text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 2s or 150ms)")
    value = float(m.group(1))
    return value * 1000.0 if m.group(2) == "s" else value


def parse_slos(text: str | None) -> dict[str, float]:
    """'ttft=2s,tpot=100ms,e2e=10s' -> {'ttft': 2000.0, 'tpot': 100.0, 'e2el': 10000.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in SLO_KEYS:
            raise ValueError(f"bad SLO {part!r}: use ttft=..., tpot=..., e2e=...")
        slos[SLO_KEYS[key.strip()]] = parse_duration_ms(value)
    return slos


def stats_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    """Mean, std, p50, p90, p99 in milliseconds (numpy's linear percentiles, as vLLM)."""
    if not values_s:
        return {"mean": None, "std": None, "p50": None, "p90": None, "p99": None}
    a = np.asarray(values_s, dtype=float) * 1000.0
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "std": float(a.std()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def meets_slos(r: RequestRecord, slos: dict[str, float]) -> bool:
    if not r.ok:
        return False
    values_ms = {"ttft": (r.ttft_s or 0.0) * 1000, "tpot": (r.tpot_s or 0.0) * 1000, "e2el": (r.e2e_s or 0.0) * 1000}
    return all(values_ms[k] <= limit for k, limit in slos.items())


def run_duration_s(records: Sequence[RequestRecord]) -> float:
    """First send to the last response's end."""
    if not records:
        return 0.0
    start = min(r.sent_s for r in records)
    end = max((r.finished_s if r.finished_s is not None else r.sent_s) for r in records)
    return max(end - start, 1e-9)


def peak_in_flight(records: Sequence[RequestRecord]) -> int:
    events = sorted([(r.sent_s, 1) for r in records]
                    + [(r.finished_s if r.finished_s is not None else r.sent_s, -1) for r in records],
                    key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    peak = cur = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def error_examples(records: Sequence[RequestRecord]) -> dict[str, str]:
    """The first error of each kind as the server put it (its code and param), so a run that failed says why."""
    examples: dict[str, str] = {}
    for r in records:
        if not r.ok:
            examples.setdefault(r.error_kind or "unknown", r.error or "")
    return examples


def summarize(records: Sequence[RequestRecord], slos: dict[str, float] | None = None,
              duration_s: float | None = None) -> dict:
    slos = slos or {}
    done = [r for r in records if r.ok]
    dur = duration_s if duration_s is not None else run_duration_s(records)
    dur = max(dur, 1e-9)
    total_in = sum(r.num_prompt_tokens for r in done)
    total_out = sum(r.num_output_tokens for r in done)
    lags = [r.lag_s for r in records if r.lag_s is not None]
    good = sum(meets_slos(r, slos) for r in records) if slos else None
    return {
        "requests": len(records),
        "completed": len(done),
        "failed": len(records) - len(done),
        "errors": dict(sorted(Counter(r.error_kind or "unknown" for r in records if not r.ok).items())),
        "error_examples": error_examples(records),
        "duration_s": dur,
        "request_throughput_rps": len(done) / dur,
        "input_throughput_tps": total_in / dur,
        "output_throughput_tps": total_out / dur,
        "total_token_throughput_tps": (total_in + total_out) / dur,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "ttft_ms": stats_ms([r.ttft_s for r in done if r.ttft_s is not None]),
        "tpot_ms": stats_ms([t for r in done if (t := r.tpot_s) is not None]),
        "itl_ms": stats_ms([g for r in done for g in r.itls_s]),
        "e2el_ms": stats_ms([r.e2e_s for r in done if r.e2e_s is not None]),
        "slo_ms": dict(slos),
        "good_requests": good,
        "goodput_rps": None if good is None else good / dur,
        "slo_attainment": None if good is None or not records else good / len(records),
        "send_lag_ms": stats_ms(lags) if lags else None,
        "late_sends": sum(lag > LATE_SEND_S for lag in lags),
        "peak_in_flight": peak_in_flight(records),
    }


def max_rate_meeting_slos(points: Sequence[tuple[float, float | None]],
                          target: float = ATTAINMENT_TARGET) -> float | None:
    """DistServe's goodput of a sweep: the highest rate at which >= target of requests meet the SLOs.

    `points` are (rate, attainment). Conservative: every tested rate up to the answer must meet the
    target, so one lucky high rate above a failing lower one does not count.
    """
    best = None
    for rate, attainment in sorted(points):
        if attainment is None or attainment < target:
            break
        best = rate
    return best
