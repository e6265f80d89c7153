"""Scorers: each gives every candidate upstream a score in [0, 1] (higher is better) and declares what
it reads (request.GAUGES, PROMPT, SESSION), so the gateway scrapes replicas only for routers whose
scorers read their gauges.

A new scorer is a small class registered by name; the fleet file then weighs it like any other
(`routing.scorers: {my_scorer: 1, load: 1}`), and the router is not touched:

    @register
    class FewestFailuresScorer(Scorer):
        name = "fewest_failures"
        def score(self, req, cands):
            return least_is_best([u.failed for u in cands])
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from argosy.gateway.prefix_index import PrefixIndex, prefix_hashes
from argosy.gateway.routing.request import GAUGES, PROMPT, SESSION, RouteRequest

if TYPE_CHECKING:
    from argosy.config import RoutingConfig
    from argosy.gateway.health import Upstream

RING_REPLICAS = 64  # virtual nodes per upstream on the session ring


@dataclass
class ScorerContext:
    """What a router hands its scorers: the model's routing settings and the shared prefix index."""
    routing: RoutingConfig
    index: PrefixIndex
    on_prefix_insert: Callable[[list[bytes], str], None] | None = None  # shares inserts with other gateways


class Scorer:
    name: ClassVar[str]
    needs: ClassVar[frozenset[str]] = frozenset()
    # An affinity score (the upstream holds something of this request's): the picker's balance gate
    # drops it on an upstream far busier than the idlest, so affinity never piles onto a hot upstream.
    affinity: ClassVar[bool] = False

    def __init__(self, ctx: ScorerContext):
        self.ctx = ctx

    def set_upstreams(self, ups: Sequence[Upstream]) -> None:
        """The pool changed (an upstream was added or removed)."""

    def score(self, req: RouteRequest, cands: list[Upstream]) -> list[float]:
        raise NotImplementedError

    def picked(self, req: RouteRequest, chosen: Upstream) -> None:
        """The request goes to `chosen` (called even when it was the only candidate)."""


SCORERS: dict[str, type[Scorer]] = {}


def register(cls: type[Scorer]) -> type[Scorer]:
    SCORERS[cls.name] = cls
    return cls


def least_is_best(values: Sequence[float]) -> list[float]:
    """1 for the lowest value, 0 for the highest, linear between; all 1 when they are equal."""
    lo, hi = min(values), max(values)
    if hi == lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]


@register
class LoadScorer(Scorer):
    """The least loaded upstream (Upstream.load(): requests in flight from every gateway plus requests
    waiting at the replica)."""
    name = "load"
    needs = frozenset({GAUGES})

    def score(self, req, cands):
        return least_is_best([u.load() for u in cands])


@register
class QueueScorer(Scorer):
    """The shortest queue at the replica (scraped vllm:num_requests_waiting)."""
    name = "queue"
    needs = frozenset({GAUGES})

    def score(self, req, cands):
        return least_is_best([u.waiting for u in cands])


@register
class KVCacheScorer(Scorer):
    """The most free KV cache (1 - scraped vllm:kv_cache_usage_perc): an absolute score, not relative
    to the other candidates, so a small weight only breaks ties between equally loaded upstreams."""
    name = "kv_cache"
    needs = frozenset({GAUGES})

    def score(self, req, cands):
        return [max(0.0, 1.0 - u.kv_usage) for u in cands]  # summed over models, a replica's may pass 1


@register
class TokensScorer(Scorer):
    """The fewest estimated tokens (prompt + max_tokens) in flight from this gateway: long requests
    weigh more than short ones. In no preset; weigh it in `routing.scorers`."""
    name = "tokens"

    def score(self, req, cands):
        return least_is_best([u.tokens_in_flight for u in cands])


@register
class PrefixScorer(Scorer):
    """The share of the prompt's prefix blocks the upstream is guessed to hold (gateway/prefix_index.py):
    the longest cached prefix scores highest. The choice is recorded in the index."""
    name = "prefix"
    needs = frozenset({PROMPT})
    affinity = True

    def _hashes(self, req: RouteRequest) -> list[bytes]:
        if req.hashes is None:
            req.hashes = prefix_hashes(req.prompt_text, self.ctx.routing.prefix_block_chars)
        return req.hashes

    def score(self, req, cands):
        hashes = self._hashes(req)
        if not hashes:
            return [0.0] * len(cands)
        matched = self.ctx.index.match(hashes, [u.url for u in cands])
        return [matched.get(u.url, 0) / len(hashes) for u in cands]

    def picked(self, req, chosen):
        hashes = self._hashes(req)
        if hashes:
            self.ctx.index.insert(hashes, chosen.url)
            if self.ctx.on_prefix_insert is not None:
                self.ctx.on_prefix_insert(hashes, chosen.url)


@register
class CacheSpreadScorer(Scorer):
    """The upstream the prefix index guesses holds the least cache, so that new prefixes (tenants)
    spread out instead of evicting each other (with the prefix scorer, which fills the index)."""
    name = "cache_spread"

    def score(self, req, cands):
        held = self.ctx.index.held
        return least_is_best([held.get(u.url, 0) for u in cands])


def _h64(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")


@register
class SessionScorer(Scorer):
    """Consistent hashing with bounded load on the session key: 1 for the session's upstream, 0 for the
    others. Walking the ring from the key's hash, the first candidate with fewer requests in flight than
    `session_load_factor` x the mean (+1) is the session's; no session key: all 0."""
    name = "session"
    needs = frozenset({SESSION})

    def __init__(self, ctx):
        super().__init__(ctx)
        self.ring: list[tuple[int, Upstream]] = []
        self.ring_keys: list[int] = []
        self.pool_size = 0

    def set_upstreams(self, ups):
        self.ring = sorted(((_h64(f"{u.url}#{i}"), u) for u in ups for i in range(RING_REPLICAS)),
                           key=lambda e: e[0])
        self.ring_keys = [k for k, _ in self.ring]
        self.pool_size = len(ups)

    def score(self, req, cands):
        scores = [0.0] * len(cands)
        if not req.session_key or not self.ring:
            return scores
        position = {id(u): i for i, u in enumerate(cands)}
        cap = math.ceil(self.ctx.routing.session_load_factor * (sum(u.total_in_flight for u in cands) + 1)
                        / len(cands))
        i, n, seen = bisect.bisect(self.ring_keys, _h64(req.session_key)), len(self.ring), set()
        for j in range(n):
            u = self.ring[(i + j) % n][1]
            if id(u) in seen:
                continue
            seen.add(id(u))
            if id(u) in position and u.total_in_flight < cap:
                scores[position[id(u)]] = 1.0
                break
            if len(seen) == self.pool_size:
                break
        return scores


# ---------------------------------------------------------------------------- regions (docs/regions.md)
# Candidates are RegionUpstreams (the home region and other regions' gateways, for one model). A ratio to
# the best candidate, not a rank: regions 20 ms and 21 ms away score nearly the same.

RTT_FLOOR_S = 0.005  # round trips below this count as equal
PRICE_FLOOR = 0.01  # $/h


def best_over(values: Sequence[float], floor: float) -> list[float]:
    """(best + floor) / (value + floor): 1 for the lowest value, smaller for higher ones."""
    lo = min(values)
    return [(lo + floor) / (v + floor) for v in values]


@register
class RegionLatencyScorer(Scorer):
    """The region with the lowest measured round trip from this gateway (0 for the arrival region)."""
    name = "region_latency"

    def score(self, req, cands):
        return best_over([getattr(u, "rtt_s", 0.0) for u in cands], RTT_FLOOR_S)


@register
class RegionLoadScorer(Scorer):
    """The region with the largest free share of its capacity (requests in flight over live replicas x
    per-replica concurrency, from its last state plus what this gateway sent since)."""
    name = "region_load"

    def score(self, req, cands):
        return [max(0.0, 1.0 - min(u.load_share(), 1.0)) if hasattr(u, "load_share") else 1.0 for u in cands]


@register
class RegionPriceScorer(Scorer):
    """The region whose replicas of the model cost least per hour (their capacity kind's price)."""
    name = "region_price"

    def score(self, req, cands):
        return best_over([getattr(u, "usd_per_hour", 0.0) for u in cands], PRICE_FLOOR)
