"""The picker: the candidate with the highest weighted sum of scores; ties rotate.

Ties rotate: each pick starts looking at the next position, so equal upstreams take turns (with no
scorer at all, that is round robin). The prefix balance gate is the picker's rule: an upstream whose
requests in flight exceed the idlest candidate's by more than `balance_abs` and are more than
`balance_rel` times them gets no affinity score (sglang-router's thresholds), so a hot prefix spreads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from argosy.gateway.routing.request import RouteRequest
from argosy.gateway.routing.scorers import Scorer

if TYPE_CHECKING:
    from argosy.gateway.health import Upstream

TIE = 1e-9  # sums closer than this are equal (float sums of equal scores may differ in the last bit)


class WeightedPicker:
    def __init__(self, weighted: list[tuple[Scorer, float]], balance_abs: int, balance_rel: float):
        self.weighted = [(s, w) for s, w in weighted if w > 0]
        self.gated = any(s.affinity for s, _ in self.weighted)
        self.balance_abs, self.balance_rel = balance_abs, balance_rel
        self.turn = 0

    def balanced(self, cands: list[Upstream]) -> list[bool]:
        """Whether each candidate passes the balance gate (may keep its affinity score)."""
        loads = [u.total_in_flight for u in cands]
        least, a, r = min(loads), self.balance_abs, self.balance_rel
        return [not (n - least > a and n > r * least) for n in loads]

    def totals(self, req: RouteRequest, cands: list[Upstream]) -> list[float]:
        totals: list[float] | None = None
        ok = self.balanced(cands) if self.gated else None
        for scorer, weight in self.weighted:
            scores = scorer.score(req, cands)
            if ok is not None and scorer.affinity:
                scores = [s if keep else 0.0 for s, keep in zip(scores, ok, strict=True)]
            if totals is None:
                totals = [weight * s for s in scores]
            else:
                totals = [t + weight * s for t, s in zip(totals, scores, strict=True)]
        return totals or [0.0] * len(cands)

    def pick(self, req: RouteRequest, cands: list[Upstream]) -> Upstream:
        totals = self.totals(req, cands) if self.weighted else None
        self.turn += 1
        n = len(cands)
        start = self.turn % n
        if totals is None:
            return cands[start]
        best = max(totals) - TIE
        for j in range(n):
            i = (start + j) % n
            if totals[i] >= best:
                return cands[i]
        raise AssertionError("unreachable: some total is the maximum")
