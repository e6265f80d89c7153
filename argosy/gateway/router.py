"""The Router: one pool of upstreams (one model revision) and the routing pipeline over it.

choose() runs the filters (gateway/routing/filters.py), then, if more than one upstream is left, the
scorers the model's routing weights name (routing/scorers.py; `routing.policy` is a preset of weights,
routing/presets.py) and the picker (routing/picker.py); every scorer then hears which upstream won
(the prefix scorer records it in the prefix index). Callers: the gateway's proxy and shadow traffic,
and the simulator, which routes with this same code.
"""

from __future__ import annotations

from collections.abc import Collection

from argosy.config import LengthClass, RoutingConfig
from argosy.gateway.health import Upstream
from argosy.gateway.prefix_index import PrefixIndex
from argosy.gateway.routing.filters import Filter, default_filters
from argosy.gateway.routing.picker import WeightedPicker
from argosy.gateway.routing.request import GAUGES, PROMPT, RouteRequest
from argosy.gateway.routing.scorers import SCORERS, Scorer, ScorerContext

__all__ = ["RouteRequest", "Router"]


class Router:
    def __init__(self, routing: RoutingConfig, length_classes: list[LengthClass] | None, index: PrefixIndex,
                 on_prefix_insert=None, filters: list[Filter] | None = None):
        self.cfg, self.index = routing, index
        ctx = ScorerContext(routing, index, on_prefix_insert)
        weights = {name: w for name, w in routing.scorer_weights().items() if w > 0}
        self.scorers = [SCORERS[name](ctx) for name in weights]
        # Only scorers that act on the outcome are told it (a call per request saved for the others).
        self.told = [s for s in self.scorers if type(s).picked is not Scorer.picked]
        self.filters = default_filters(length_classes) if filters is None else filters  # regions: their own
        self.picker = WeightedPicker([(s, weights[s.name]) for s in self.scorers], routing.balance_abs,
                                     routing.balance_rel)
        self.needs: frozenset[str] = frozenset().union(*(s.needs for s in self.scorers))
        self.upstreams: list[Upstream] = []

    @property
    def needs_gauges(self) -> bool:
        """Whether a scorer reads the replicas' scraped vllm:* gauges (the gateway scrapes only then)."""
        return GAUGES in self.needs

    @property
    def needs_prompt(self) -> bool:
        return PROMPT in self.needs

    def set_upstreams(self, ups: list[Upstream]) -> None:
        self.upstreams = list(ups)
        for plugin in (*self.filters, *self.scorers):
            plugin.set_upstreams(self.upstreams)

    def candidates(self, req: RouteRequest, exclude: Collection[str] = frozenset()) -> list[Upstream]:
        cands = self.upstreams
        for f in self.filters:
            cands = f.apply(req, cands, exclude)
            if not cands:
                break
        return cands

    def choose(self, req: RouteRequest, exclude: Collection[str] = frozenset()) -> Upstream | None:
        cands = self.candidates(req, exclude)
        if not cands:
            return None
        chosen = cands[0] if len(cands) == 1 else self.picker.pick(req, cands)
        for s in self.told:
            s.picked(req, chosen)
        return chosen
