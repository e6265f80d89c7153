"""Routing policies over one pool of upstreams (one model revision).

round_robin; least_load (in-flight requests and tokens from the gateway's own accounting, refreshed
by scraped vllm:* gauges); prefix (longest cached prefix, behind a balance gate, else least load);
session (consistent hashing with bounded load on a header or the `user` field); length_classes
(pools by prompt length; also a pre-filter for any other policy when `length_classes` is set).
"""

from __future__ import annotations

import bisect
import hashlib
import math
from dataclasses import dataclass, field

from argosy.config import LengthClass, RoutingConfig
from argosy.gateway.health import Upstream
from argosy.gateway.prefix_index import PrefixIndex, prefix_hashes

RING_REPLICAS = 64  # virtual nodes per upstream on the session ring


@dataclass
class RouteRequest:
    prompt_text: str
    prompt_tokens: int  # estimate
    session_key: str | None = None
    hashes: list[bytes] | None = field(default=None, repr=False)


def _h64(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")


class Router:
    def __init__(self, routing: RoutingConfig, length_classes: list[LengthClass] | None, index: PrefixIndex,
                 on_prefix_insert=None):
        self.cfg = routing
        self.policy = routing.policy
        self.class_specs = length_classes or []
        self.index = index
        self.on_prefix_insert = on_prefix_insert  # shares inserts with other gateways (redis), if set
        self.upstreams: list[Upstream] = []
        self.classes: list[list[Upstream]] = []
        self.ring: list[tuple[int, Upstream]] = []
        self.ring_keys: list[int] = []
        self.rr = 0

    def set_upstreams(self, ups: list[Upstream]) -> None:
        self.upstreams = list(ups)
        by_url = {u.url: u for u in ups}
        self.classes = []
        if self.class_specs:
            rest = list(ups)
            explicit = {url for c in self.class_specs for url in (c.upstreams or [])}
            rest = [u for u in ups if u.url not in explicit]
            for i, c in enumerate(self.class_specs):
                if c.upstreams is not None:
                    pool = [by_url[x] for x in c.upstreams if x in by_url]
                elif i == len(self.class_specs) - 1:
                    pool, rest = rest, []  # the longest class takes what is left (e.g. upstreams added later)
                else:
                    pool, rest = rest[:c.replicas], rest[c.replicas:]
                self.classes.append(pool)
        self.ring = sorted((_h64(f"{u.url}#{i}"), u) for u in ups for i in range(RING_REPLICAS))
        self.ring_keys = [k for k, _ in self.ring]

    # ------------------------------------------------------------------ candidates

    def candidates(self, req: RouteRequest, exclude: set[str]) -> list[Upstream]:
        if not self.classes:
            return [u for u in self.upstreams if u.url not in exclude and u.available()]
        k = next((i for i, c in enumerate(self.class_specs) if req.prompt_tokens <= c.max_prompt_tokens),
                 len(self.class_specs) - 1)
        # Own class first; if it has nothing live, longer classes (they can take short prompts),
        # then shorter ones: availability beats isolation.
        for i in [k, *range(k + 1, len(self.classes)), *range(k - 1, -1, -1)]:
            c = [u for u in self.classes[i] if u.url not in exclude and u.available()]
            if c:
                return c
        return []

    def choose(self, req: RouteRequest, exclude: set[str] = frozenset()) -> Upstream | None:
        cands = self.candidates(req, exclude)
        if not cands:
            return None
        if len(cands) == 1 and self.policy != "prefix":
            return cands[0]
        p = self.policy
        if p == "round_robin":
            self.rr += 1
            return cands[self.rr % len(cands)]
        if p == "prefix":
            return self._prefix(req, cands)
        if p == "session" and req.session_key:
            return self._session(req.session_key, cands)
        return self._least_load(cands)

    def _least_load(self, cands: list[Upstream]) -> Upstream:
        self.rr += 1
        s = self.rr % len(cands)  # rotate so ties do not always go to the first upstream
        return min(cands[s:] + cands[:s], key=Upstream.load)

    def _prefix(self, req: RouteRequest, cands: list[Upstream]) -> Upstream:
        if req.hashes is None:
            req.hashes = prefix_hashes(req.prompt_text, self.cfg.prefix_block_chars)
        matched = self.index.match(req.hashes, [u.url for u in cands]) if req.hashes else {}
        min_load = min(u.total_in_flight for u in cands)
        a, r = self.cfg.balance_abs, self.cfg.balance_rel

        def gate_ok(u: Upstream) -> bool:  # balance gate: affinity never piles onto a hot upstream
            n = u.total_in_flight
            return not (n - min_load > a and n > r * min_load)

        best, best_key = None, None
        for u in cands:
            m = matched.get(u.url, 0)
            if m == 0 or not gate_ok(u):
                continue
            key = (m, -u.load())
            if best_key is None or key > best_key:
                best, best_key = u, key
        # No usable affinity: least load, then the upstream the index guesses holds the least cache,
        # so new prefixes (tenants) spread out instead of evicting each other.
        chosen = best or min(cands, key=lambda u: (u.load(), self.index.held.get(u.url, 0)))
        if req.hashes:
            self.index.insert(req.hashes, chosen.url)
            if self.on_prefix_insert:
                self.on_prefix_insert(req.hashes, chosen.url)
        return chosen

    def _session(self, key: str, cands: list[Upstream]) -> Upstream:
        allowed = {id(u) for u in cands}
        total = sum(u.total_in_flight for u in cands)
        cap = math.ceil(self.cfg.session_load_factor * (total + 1) / len(cands))
        i = bisect.bisect(self.ring_keys, _h64(key))
        n, seen = len(self.ring), set()
        for j in range(n):
            u = self.ring[(i + j) % n][1]
            if id(u) in seen:
                continue
            seen.add(id(u))
            if id(u) in allowed and u.total_in_flight < cap:
                return u
            if len(seen) == len(self.upstreams):
                break
        return self._least_load(cands)
