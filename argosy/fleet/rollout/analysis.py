"""One analysis: the candidate against the stable revision over the same window, gate by gate.

Pure functions over the gateway's window statistics (argosy.gateway.revision_stats.WindowStats), so the
verdicts are unit-tested without processes. A gate is `pass`, `fail` or `inconclusive`: inconclusive
when either side (the stable only for a relative gate) has fewer than `min_samples` in the window, so
a quiet window never passes. The analysis fails if a gate fails, is inconclusive if none fails but one
is inconclusive, and passes only when every gate passes.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from argosy.config_rollout import LOWER_IS_BETTER, AnalysisGate
from argosy.gateway.revision_stats import WindowStats, percentile

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
UNITS = {"error_rate": "", "ttft_p50": "s", "ttft_p95": "s", "itl_p95": "s", "e2e_p50": "s", "e2e_p95": "s",
         "tokens_per_s_per_replica": "tok/s", "shadow_agreement": ""}


@dataclass
class Side:
    """What one revision showed in the window: its requests and how many replicas served them."""
    stats: WindowStats
    replicas: int = 1
    agreement: float | None = None  # candidate only: identical share of greedy shadow pairs
    agreement_pairs: int = 0


def measure(metric: str, side: Side, window_s: float) -> tuple[float | None, int]:
    """(value, samples) of one metric for one side; value None when there is nothing to measure."""
    w = side.stats
    if metric == "error_rate":
        return (w.failed / w.requests if w.requests else None), w.requests
    if metric in ("ttft_p50", "ttft_p95"):
        return percentile(w.ttft, 50 if metric == "ttft_p50" else 95), len(w.ttft)
    if metric == "itl_p95":
        return percentile(w.gaps, 95), len(w.ttft)  # samples: the streamed requests the gaps came from
    if metric in ("e2e_p50", "e2e_p95"):
        return percentile(w.e2e, 50 if metric == "e2e_p50" else 95), len(w.e2e)
    if metric == "tokens_per_s_per_replica":
        return (w.tokens / window_s / max(side.replicas, 1) if w.requests else None), w.requests
    if metric == "shadow_agreement":
        return side.agreement, side.agreement_pairs
    raise ValueError(f"unknown metric {metric!r}")


@dataclass
class GateResult:
    metric: str
    verdict: str
    candidate: float | None
    stable: float | None
    bound: str  # the condition, as a person reads it: "<= 1.5x stable (0.12 s)"
    samples: tuple[int, int]  # (candidate, stable)


def check(gate: AnalysisGate, cand: Side, stable: Side, window_s: float, min_samples: int) -> GateResult:
    cv, cn = measure(gate.metric, cand, window_s)
    sv, sn = measure(gate.metric, stable, window_s) if gate.metric != "shadow_agreement" else (None, 0)
    relative = gate.max_ratio is not None or gate.min_ratio is not None
    unit = UNITS[gate.metric]
    bounds, ok = [], True
    lower = LOWER_IS_BETTER[gate.metric]
    enough = cn >= min_samples and cv is not None and (not relative or (sn >= min_samples and sv is not None))
    if gate.max is not None:
        bounds.append(f"<= {gate.max:g}{unit}")
        ok = ok and (cv is not None and cv <= gate.max)
    if gate.min is not None:
        bounds.append(f">= {gate.min:g}{unit}")
        ok = ok and (cv is not None and cv >= gate.min)
    if relative:
        ratio = gate.max_ratio if lower else gate.min_ratio
        limit = ratio * sv if sv is not None else None
        bounds.append(f"{'<=' if lower else '>='} {ratio:g}x stable"
                      + (f" ({limit:.4g}{unit})" if limit is not None else ""))
        if limit is not None and cv is not None:
            ok = ok and (cv <= limit if lower else cv >= limit)
    verdict = INCONCLUSIVE if not enough else PASS if ok else FAIL
    return GateResult(gate.metric, verdict, _round(cv), _round(sv), " and ".join(bounds), (cn, sn))


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


@dataclass
class AnalysisResult:
    verdict: str
    gates: list[GateResult]
    window_s: float
    at: float  # wall clock

    def as_dict(self) -> dict:
        return asdict(self)

    def story(self) -> str:
        """One line: each gate's value against its bound."""
        parts = []
        for g in self.gates:
            c = "n/a" if g.candidate is None else f"{g.candidate:.4g}"
            s = "" if g.stable is None else f" (stable {g.stable:.4g})"
            parts.append(f"{g.metric} {c}{s} {g.bound}: {g.verdict} [n={g.samples[0]}/{g.samples[1]}]")
        return "; ".join(parts)


def evaluate(gates: list[AnalysisGate], cand: Side, stable: Side, window_s: float, min_samples: int,
             now: float | None = None) -> AnalysisResult:
    results = [check(g, cand, stable, window_s, min_samples) for g in gates]
    verdicts = {r.verdict for r in results}
    verdict = FAIL if FAIL in verdicts else INCONCLUSIVE if INCONCLUSIVE in verdicts or not results else PASS
    return AnalysisResult(verdict, results, window_s, time.time() if now is None else now)
