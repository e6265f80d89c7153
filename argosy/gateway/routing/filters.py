"""Filters: which upstreams of the pool may take a request. Each narrows the list the previous one left.

A filter is a small class with `apply(request, candidates, tried) -> candidates` (order kept: the
picker's tie rotation counts positions) and, if it keeps state about the pool, `set_upstreams`.
A region, residency or revision filter is one more class here, added to `default_filters`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from argosy.gateway.routing.request import RouteRequest

if TYPE_CHECKING:
    from argosy.config import LengthClass
    from argosy.gateway.health import Upstream
    from argosy.gateway.regions.upstream import RegionUpstream


class Filter:
    def set_upstreams(self, ups: Sequence[Upstream]) -> None:
        """The pool changed (an upstream was added or removed)."""

    def apply(self, req: RouteRequest, cands: list[Upstream], tried: Collection[str]) -> list[Upstream]:
        raise NotImplementedError


class LiveFilter(Filter):
    """Live and not ejected: the circuit breaker is closed, or half-open with no probe in flight."""

    def apply(self, req, cands, tried):
        return [u for u in cands if u.available()]


class NotTriedFilter(Filter):
    """Not yet tried for this request (a retry before the first byte goes elsewhere)."""

    def apply(self, req, cands, tried):
        return [u for u in cands if u.url not in tried] if tried else cands


class LengthClassFilter(Filter):
    """Pools by estimated prompt tokens: a prompt goes to the first class whose `max_prompt_tokens` it
    fits. With model-level upstreams each class takes the next `replicas` of them in order (the last
    takes the rest, e.g. upstreams added later), or a class names its `upstreams`."""

    def __init__(self, classes: list[LengthClass]):
        self.specs = classes
        self.pools: list[list[Upstream]] = []

    def set_upstreams(self, ups):
        by_url = {u.url: u for u in ups}
        explicit = {url for c in self.specs for url in (c.upstreams or [])}
        rest = [u for u in ups if u.url not in explicit]
        self.pools = []
        for i, c in enumerate(self.specs):
            if c.upstreams is not None:
                pool = [by_url[x] for x in c.upstreams if x in by_url]
            elif i == len(self.specs) - 1:
                pool, rest = rest, []
            else:
                pool, rest = rest[:c.replicas], rest[c.replicas:]
            self.pools.append(pool)

    def apply(self, req, cands, tried):
        k = next((i for i, c in enumerate(self.specs) if req.prompt_tokens <= c.max_prompt_tokens),
                 len(self.specs) - 1)
        allowed = {id(u) for u in cands}
        # Own class first; if it has nothing left, longer classes (they can take short prompts), then
        # shorter ones: availability beats isolation.
        for i in [k, *range(k + 1, len(self.pools)), *range(k - 1, -1, -1)]:
            pool = [u for u in self.pools[i] if id(u) in allowed]
            if pool:
                return pool
        return []


def default_filters(length_classes: list[LengthClass] | None) -> list[Filter]:
    filters: list[Filter] = [LiveFilter(), NotTriedFilter()]
    if length_classes:
        filters.append(LengthClassFilter(length_classes))
    return filters


# ---------------------------------------------------------------------------- regions (docs/regions.md)
# Candidates are RegionUpstreams (gateway/regions/upstream.py): the home region and the other regions'
# gateways, for one model.

class RegionLiveFilter(Filter):
    """Regions that may take the model now: allowed to run it, and in by outlier detection; a region that
    ramps back after an outage is kept with a probability equal to its share (its share of the traffic
    grows from 0 to 1 over the ramp)."""

    def __init__(self, rng: Callable[[], float] = random.random):
        self.rng = rng

    def apply(self, req, cands: list[RegionUpstream], tried):
        out = []
        for u in cands:
            share = u.health.share() if u.allowed else 0.0
            if share >= 1.0 or (share > 0.0 and self.rng() < share):
                out.append(u)
        return out


class ResidencyFilter(Filter):
    """A request pinned to a jurisdiction goes only to regions of that jurisdiction."""

    def apply(self, req, cands: list[RegionUpstream], tried):
        return cands if req.residency is None else [u for u in cands if u.jurisdiction == req.residency]


class HomeFirstFilter(Filter):
    """The arrival region while it is below its saturation threshold; otherwise the other regions below
    theirs; if every one is saturated, the arrival region still (it queues at home); with no arrival
    region left, every candidate (the scorers pick the least loaded)."""

    def apply(self, req, cands: list[RegionUpstream], tried):
        home = next((u for u in cands if u.home), None)
        if home is not None and not home.saturated():
            return [home]
        room = [u for u in cands if not u.home and not u.saturated()]
        if room:
            return room
        return [home] if home is not None else cands


def region_filters(rng: Callable[[], float] = random.random) -> list[Filter]:
    return [RegionLiveFilter(rng), NotTriedFilter(), ResidencyFilter(), HomeFirstFilter()]
