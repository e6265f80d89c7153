"""A model as the gateway sees it: admission, guardrails, weighted routes between revisions (the
mechanism rollouts drive) and where its shadow traffic goes (argosy.gateway.shadow).

ModelRuntime is also what the fleet controller drives (argosy.fleet.seams.ModelRoutes): replicas join
and leave its revisions' routing sets, a rollout sets the split, the candidate's shadow and session
pins, and reads the per-revision request samples (RevisionStats); it reports in-flight and finished
counts per replica and the admission load, and the controller's activator hook holds requests while
a model has no live replica but one is starting (scale from zero, a rolling upgrade of one replica).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from argosy.config import GatewayConfig, ModelConfig, TrafficRoute
from argosy.gateway.admission import Admission, AdmissionLoad
from argosy.gateway.guardrails import Guardrails
from argosy.gateway.health import Upstream
from argosy.gateway.prefix_index import PrefixIndex
from argosy.gateway.revision_stats import RevisionStats, WindowStats
from argosy.gateway.router import Router
from argosy.gateway.scraper import ReplicaGauges
from argosy.gateway.shadow import ShadowTarget
from argosy.gateway.shadow_pairs import PairStore


class UpstreamRegistry:
    """One Upstream per URL, shared by every model and revision that lists it."""

    def __init__(self, gw: GatewayConfig):
        self.gw = gw
        self.by_url: dict[str, Upstream] = {}

    def get(self, url: str) -> Upstream:
        url = url.rstrip("/")
        u = self.by_url.get(url)
        if u is None:
            u = self.by_url[url] = Upstream(url, self.gw.eject_after_failures, self.gw.eject_for_s)
        return u

    def find(self, url: str) -> Upstream | None:
        return self.by_url.get(url.rstrip("/"))

    def forget(self, url: str) -> None:
        """Drop an upstream's state (breaker, counts): a later replica on the same address starts fresh."""
        self.by_url.pop(url.rstrip("/"), None)

    def take_gauges(self, url: str, g: ReplicaGauges) -> None:
        """A replica's scraped load (ReplicaScraper): the queue and KV usage this gateway does not see."""
        u = self.by_url.get(url)
        if u is not None:
            u.waiting, u.kv_usage = g.waiting, g.kv_usage


class ModelRuntime:
    def __init__(self, cfg: ModelConfig, reg: UpstreamRegistry, index: PrefixIndex, on_insert, session_getter):
        self.cfg, self.name, self.reg = cfg, cfg.name, reg
        self.index, self.on_insert = index, on_insert
        self.admission = Admission(cfg.admission)
        self.tokens_in_flight = 0  # estimated tokens of the requests admitted or queued (Gateway.admitted)
        g = cfg.guardrails
        self.guardrails = Guardrails(g, session_getter) if (g.input or g.output) else None
        self.output_guard = self.guardrails if g.output else None
        self.routers: dict[str, Router] = {}
        self.stable = cfg.stable_at_start()
        routes = cfg.traffic or [TrafficRoute(revision=self.stable, weight=1.0)]
        self.weights: list[tuple[str, float]] = []
        for r in routes:
            own = r.revision == cfg.revision
            urls = r.upstreams if r.upstreams is not None else (cfg.upstreams or [] if own else [])
            self._router(r.revision, urls)
            self.weights.append((r.revision, r.weight))
        for rev in cfg.resolved() if cfg.revisions else ():
            self.routers.get(rev) or self._router(rev, [])
        self.total_weight = sum(w for _, w in self.weights) or 1.0
        self.shadow = cfg.shadow
        self.shadow_router: Router | None = None
        # Set by the fleet controller (argosy serve): `await activator()` holds a request while the model
        # has no live upstream and a replica is starting (scale from zero), or raises a GatewayError.
        self.activator: Callable[[], Awaitable[None]] | None = None
        if cfg.shadow:
            least_load = cfg.routing.model_copy(update={"policy": "least_load", "scorers": None})
            self.shadow_router = Router(least_load, None, index)
            self.shadow_router.set_upstreams([reg.get(x) for x in cfg.shadow.upstreams or []])
        # A rollout (argosy.fleet.rollout) drives the rest: the candidate's shadow, the revisions a request
        # may name in `rollout.revision_header`, session pins and the per-revision request samples.
        self.rollout_shadow: ShadowTarget | None = None
        self.selectable: frozenset[str] = frozenset()
        self.pins: SessionPins | None = None
        self.recording = False
        self.stats = RevisionStats()
        self.pairs = PairStore()  # the gateway's Shadower shares its own (Gateway.__init__)

    def _router(self, revision: str, urls: list[str]) -> Router:
        r = Router(self.cfg.routing, self.cfg.length_classes, self.index, self.on_insert)
        r.set_upstreams([self.reg.get(x) for x in urls])
        self.routers[revision] = r
        return r

    def pick(self, session_key: str | None, wanted: str | None = None) -> tuple[str, Router]:
        """The revision for a request: one named in the revision header (a rollout's candidate or stable),
        else the session's pinned one while a rollout runs, else by weight (a session key hashes to a
        stable choice); a revision with nothing live gives way to one that has."""
        if wanted is not None and wanted in self.selectable and self._live(wanted):
            return wanted, self.routers[wanted]
        if len(self.weights) == 1:
            rev = self.weights[0][0]
            if len(self.routers) == 1 or self._live(rev):
                return rev, self.routers[rev]
            rev = next((r for r in self.routers if self._live(r)), rev)  # e.g. a rolling upgrade's new one
            return rev, self.routers[rev]
        rev = self.pins.get(session_key, self.weight_of) if self.pins is not None and session_key else None
        if rev is None:
            rev = self._by_weight(session_key)
            if self.pins is not None and session_key:
                self.pins.put(session_key, rev)
        if not self._live(rev):  # e.g. a canary that lost its replica: availability beats the split
            rev = next((r for r, _ in sorted(self.weights, key=lambda x: -x[1]) if self._live(r)), rev)
        return rev, self.routers[rev]

    def _by_weight(self, session_key: str | None) -> str:
        if session_key:
            x = int.from_bytes(hashlib.blake2b(session_key.encode(), digest_size=8).digest(), "big") / 2**64
        else:
            x = random.random()
        x *= self.total_weight
        for rev, w in self.weights:
            if x < w:
                return rev
            x -= w
        return self.weights[-1][0]

    def _live(self, revision: str) -> bool:
        r = self.routers.get(revision)
        return r is not None and any(u.available() for u in r.upstreams)

    def weight_of(self, revision: str) -> float:
        return next((w for r, w in self.weights if r == revision), 0.0)

    def fallback_for(self, revision: str) -> tuple[str, Router] | None:
        """Where a request goes if its revision's upstreams all fail before the first byte: the stable's."""
        r = self.routers.get(self.stable)
        return (self.stable, r) if revision != self.stable and r is not None else None

    def upstreams(self) -> list[Upstream]:
        seen = {u.url: u for r in self.routers.values() for u in r.upstreams}
        if self.shadow_router:
            seen.update({u.url: u for u in self.shadow_router.upstreams})
        return list(seen.values())

    def add_upstream(self, url: str, revision: str | None = None) -> None:
        rev = revision or self.cfg.revision
        r = self.routers.get(rev) or (self._router(rev, []) if revision else self.routers[self.weights[0][0]])
        if url.rstrip("/") not in {u.url for u in r.upstreams}:
            r.set_upstreams([*r.upstreams, self.reg.get(url)])

    def remove_upstream(self, url: str) -> bool:
        url, found = url.rstrip("/"), False
        for r in self.routers.values():
            if any(u.url == url for u in r.upstreams):
                r.set_upstreams([u for u in r.upstreams if u.url != url])
                found = True
        return found

    # ------------------------------------------------------------------ what a rollout sets

    def set_split(self, split: dict[str, float], stable: str) -> None:
        """Percent per revision (those at 0 take no weighted traffic but keep their upstreams)."""
        for rev in split:
            self.routers.get(rev) or self._router(rev, [])
        self.weights = [(rev, float(w)) for rev, w in split.items() if w > 0] or [(stable, 100.0)]
        self.total_weight = sum(w for _, w in self.weights) or 1.0
        self.stable = stable

    def set_rollout(self, candidate: str | None, shadow_sample: float = 0.0,
                    shadow_feeds_analysis: bool = False) -> None:
        """A rollout begins (its candidate revision) or ends (None): session pins, the revision header,
        request samples for the analysis, and a share of the stable's requests mirrored to the candidate."""
        if candidate is None:
            self.selectable, self.pins, self.recording, self.rollout_shadow = frozenset(), None, False, None
            self.stats.clear()
            return
        self.routers.get(candidate) or self._router(candidate, [])
        self.selectable = frozenset({candidate, self.stable}) if self.cfg.rollout.revision_header else frozenset()
        self.pins = self.pins or SessionPins()
        self.recording = True
        sh = self.cfg.rollout.shadow
        self.rollout_shadow = None if shadow_sample <= 0 else ShadowTarget(
            candidate, self.routers[candidate], shadow_sample, sh.max_in_flight, sh, shadow_feeds_analysis)

    def window(self, t0: float, t1: float) -> dict[tuple[str, str], WindowStats]:
        """Requests finished in [t0, t1) (monotonic), by (revision, live or shadow)."""
        return self.stats.window(t0, t1)

    def agreement(self, revision: str, t0: float, t1: float) -> tuple[float | None, int]:
        """Identical share of greedy shadow pairs with this candidate in [t0, t1), and their count."""
        return self.pairs.agreement(self.name, revision, t0, t1)

    def shadow_target(self, served: str) -> ShadowTarget | None:
        """Where to mirror a request that `served` answered: a rollout's candidate (only requests the
        stable served), else the fleet file's `shadow` upstreams."""
        t = self.rollout_shadow
        if t is not None:
            return t if served == self.stable and t.revision != served else None
        if self.shadow is not None and self.shadow_router is not None:
            return ShadowTarget(self.shadow.revision, self.shadow_router, self.shadow.sample, self.shadow.max_in_flight,
                                self.cfg.rollout.shadow)  # the judge, if the model's rollout names one
        return None

    # ------------------------------------------------------------------ what the fleet controller reads

    def in_flight(self, url: str) -> int:
        """This gateway's requests in flight on one upstream (0 for one it does not know)."""
        u = self.reg.find(url)
        return u.in_flight if u is not None else 0

    def finished(self, url: str) -> int | None:
        """Requests this gateway finished on one upstream, answered or failed; None for one it does not know."""
        u = self.reg.find(url)
        return None if u is None else u.served + u.failed

    def admission_load(self) -> AdmissionLoad:
        return dataclasses.replace(self.admission.load(), tokens=self.tokens_in_flight)

    def has_live_upstream(self) -> bool:
        return any(u.available() for r in self.routers.values() for u in r.upstreams)

    def set_activator(self, hook: Callable[[], Awaitable[None]] | None) -> None:
        self.activator = hook


class SessionPins:
    """Session key -> the revision it started on, while a rollout runs (bounded, least recently used out).
    A pin holds while its revision has weight; a session whose revision lost it is placed again."""

    def __init__(self, max_sessions: int = 100_000):
        self.max = max_sessions
        self.pins: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str, weight_of: Callable[[str], float]) -> str | None:
        rev = self.pins.get(key)
        if rev is None:
            return None
        if weight_of(rev) <= 0:
            del self.pins[key]
            return None
        self.pins.move_to_end(key)
        return rev

    def put(self, key: str, revision: str) -> None:
        self.pins[key] = revision
        if len(self.pins) > self.max:
            self.pins.popitem(last=False)


