"""One model's reconcile loop: per revision it runs, observe load, ask that revision's autoscaler, start,
promote, drain and replace replicas.

Which revisions run, at what size and with what traffic split is the rollout's to say (argosy.fleet.rollout):
`plans` holds, per revision, a floor (a canary sized to its weight, a blue-green preview at full size) or a
fixed count; a revision without a plan is drained. With no rollout, the stable revision alone runs,
autoscaled as before. A rolling upgrade freezes the loop (`frozen`) and places replicas itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from dataclasses import dataclass

from argosy.fleet.autoscaler import Autoscaler, Decision, Observation
from argosy.fleet.replica import LIVE, READY, STARTING, WARMING, Replica
from argosy.fleet.replica_set import ReplicaSet
from argosy.gateway.errors import unavailable
from argosy.gateway.scraper import ReplicaGauges

log = logging.getLogger("argosy.fleet")


@dataclass
class Plan:
    """How many replicas a revision runs: at least `floor` (with its autoscaler above), or exactly `fixed`."""
    floor: int = 0
    fixed: int | None = None


class ModelController(ReplicaSet):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.scalers: dict[str, Autoscaler] = {}
        self.plans: dict[str, Plan] = {self.stable: Plan()}
        self.split: dict[str, float] = {self.stable: 100.0}
        self.desired: dict[str, int] = {}  # per revision, the last decision (its plan applied)
        self.frozen = False  # a rolling upgrade starts and drains replicas itself
        self.expecting = 0  # replicas a rollout is about to start: the activator holds requests for them
        self.decisions: deque[dict] = deque(maxlen=20)
        self.wake = asyncio.Event()
        self.held = 0
        self.done_counts: dict[str, int] = {}
        self.started_t = self.clock()
        self.last_obs_t: dict[str, float] = {}  # per revision
        self.task: asyncio.Task | None = None
        self.scaler_for(self.stable)  # now: scale to zero counts the idle time from the controller's start
        self.routes.set_activator(self.activate)
        self.m.watch(self)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        while True:
            self.wake.clear()
            try:
                await self.tick()
            except Exception:  # a bug in one tick must not end the loop that keeps replicas alive
                log.exception("fleet: %s: tick failed", self.name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.a.tick_s)

    def poke(self) -> None:
        self.wake.set()

    @property
    def scaler(self) -> Autoscaler:
        return self.scaler_for(self.stable)

    def scaler_for(self, revision: str) -> Autoscaler:
        if revision not in self.scalers:
            self.scalers[revision] = Autoscaler(self.revisions[revision].autoscaling, self.clock)
        return self.scalers[revision]

    async def tick(self) -> None:
        total = 0
        for rev in list(self.plans):
            total += await self.scale(rev)
        self.m.desired.labels(self.name).set(total)
        if not self.frozen:  # revisions a rollout let go of
            for rev in {r.revision for r in self.replicas.values() if r.state in LIVE} - set(self.plans):
                self.retire(rev)

    async def scale(self, rev: str) -> int:
        """One revision's decision: its autoscaler's, bounded by its plan; then its replicas follow."""
        scaler, ready = self.scaler_for(rev), self.ready_routed(rev)
        gauges = None
        if scaler.metric.needs_scrape:
            gauges = await self.gateway.scraper.refresh(r.url for r in ready if r.url)
        scaler.observe(self.observe(ready, gauges, rev), len(ready))
        active = [r for r in self.of(rev) if not r.pooled and r.state in LIVE]
        d = scaler.decide(len(ready), len(active))
        plan = self.plans[rev]
        desired = plan.fixed if plan.fixed is not None else max(d.desired, plan.floor)
        self.record(d, rev, desired)
        self.desired[rev] = desired
        if not self.frozen:
            self.reconcile(desired, rev)
        return desired

    def share(self, rev: str) -> float:
        total = sum(self.split.values())
        return 1.0 if len(self.plans) == 1 or total <= 0 else self.split.get(rev, 0.0) / total

    def observe(self, ready: list[Replica], gauges: dict[str, ReplicaGauges] | None = None,
                revision: str | None = None) -> Observation:
        """What a revision's autoscaler sees: its share (by the split) of the gateway's admission load, its
        replicas' finished-request rate and, when the metric needs them, its ready replicas' scraped queue
        and KV usage (`gauges` by URL). With one revision running: the model's whole load."""
        now, rev = self.clock(), revision or self.stable
        load = self.routes.admission_load()
        share = self.share(rev)
        total = 0
        for r in self.replicas.values():
            if len(self.plans) > 1 and r.revision != rev:
                continue
            n = self.routes.finished(r.url) if r.url else None
            if n is not None:
                total += n - self.done_counts.get(r.url, n)  # new replicas count from now
                self.done_counts[r.url] = n
        dt = max(now - self.last_obs_t.get(rev, self.started_t), 1e-3)
        self.last_obs_t[rev] = now
        scraped = [g for r in ready if (g := (gauges or {}).get(r.url or "")) is not None]
        kv = sum(g.kv_usage for g in scraped) / len(scraped) if scraped else 0.0
        return Observation(concurrency=(load.in_flight + load.waiting) * share, rps=total / dt,
                           queue=load.waiting * share + sum(g.waiting for g in scraped), kv_cache=kv,
                           tokens=load.tokens * share)

    def record(self, d: Decision, rev: str, desired: int) -> None:
        self.m.decisions.labels(self.name, d.direction, d.kind).inc()
        if rev == self.stable:
            self.m.panic.labels(self.name).set(1 if d.panic else 0)
            self.m.observed.labels(self.name, "stable").set(d.stable_value)
            self.m.observed.labels(self.name, "panic").set(d.panic_value)
        entry = {"event": "scale_decision", "model": self.name, "revision": rev, "at": time.strftime("%H:%M:%S"),
                 **d.as_dict()}
        if desired != d.desired:
            entry.update(desired=desired, reason=d.reason + f"; {desired} by the rollout's plan")
        prev = next((e for e in reversed(self.decisions) if e["revision"] == rev), None)
        changed = prev is None or prev["desired"] != entry["desired"] or prev["panic"] != d.panic
        if d.direction != "hold" or changed:
            self.decisions.append(entry)
            log.info(json.dumps(entry))

    # ------------------------------------------------------------------ reconcile

    def reconcile(self, desired: int, rev: str | None = None) -> None:
        rev = rev or self.stable
        warm_pool = self.revisions[rev].autoscaling.warm_pool
        mine = self.of(rev)
        active = [r for r in mine if not r.pooled and r.state in LIVE]
        pool = sorted((r for r in mine if r.pooled and r.state in LIVE), key=lambda r: r.state != READY)
        for _ in range(desired - len(active)):
            if pool:  # the warm pool takes traffic the moment it is needed
                r = pool.pop(0)
                r.pooled = False
                log.info("fleet: %s: %s promoted from the warm pool (%s)", self.name, r.id, r.state)
                if r.state == READY:
                    self.route(r)
            elif not self.launch(pooled=False, rev=rev):
                break
        if desired < len(active):
            order = {STARTING: 0, WARMING: 1, READY: 2}
            victims = sorted(active, key=lambda r: (order[r.state], self._in_flight(r), -r.created))
            for r in victims[:len(active) - desired]:
                asyncio.get_running_loop().create_task(self.drain(r))
        for _ in range(warm_pool - len(pool)):
            if not self.launch(pooled=True, rev=rev):
                break
        for r in pool[warm_pool:]:
            asyncio.get_running_loop().create_task(self.drain(r))

    def retire(self, rev: str) -> list[asyncio.Task]:
        """Drain and stop every replica of a revision (its plan is gone: an aborted canary, a replaced stable)."""
        self.plans.pop(rev, None)
        self.scalers.pop(rev, None)
        self.desired.pop(rev, None)
        return [asyncio.get_running_loop().create_task(self.drain(r)) for r in self.of(rev)
                if r.state in LIVE]

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await asyncio.gather(*(self.drain(r, timeout=0) for r in list(self.replicas.values())),
                             return_exceptions=True)

    # ------------------------------------------------------------------ the activator

    async def activate(self) -> None:
        """Hold a request while the model has no live upstream but a replica is (or will be) starting."""
        if self.routes.has_live_upstream():
            return
        self._refuse_if_unplaceable()
        starting = self.expecting > 0 or any(r.state in (STARTING, WARMING) for r in self.replicas.values())
        if self.ready_routed() and not starting:
            return  # replicas exist but are ejected: the proxy answers (503) as before
        self.held += 1
        self.poke()
        deadline = self.clock() + self.a.cold_start_timeout_s
        try:
            while not self.routes.has_live_upstream():
                self._refuse_if_unplaceable()  # the launch this request woke up found no room
                left = deadline - self.clock()
                if left <= 0:
                    raise unavailable(f"model {self.name!r}: no replica became ready within "
                                      f"{self.a.cold_start_timeout_s:g} s; retry later", "cold_start_timeout",
                                      retry_after=5.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.routed.wait(), min(left, 1.0))
        finally:
            self.held -= 1

    def _refuse_if_unplaceable(self) -> None:
        if self.unplaceable and not self.replicas:
            raise unavailable(f"model {self.name!r} has no replica and none can be placed: {self.unplaceable}",
                              "unplaceable", retry_after=30.0)

    def status(self) -> dict:
        load = self.routes.admission_load()
        revisions = {rev: {"desired": self.desired.get(rev), "ready": len(self.ready_routed(rev)),
                           "weight": self.split.get(rev, 0.0), "checkpoint": self.revisions[rev].checkpoint}
                     for rev in dict.fromkeys([*self.plans, *(r.revision for r in self.replicas.values())])
                     if rev in self.revisions}
        desired = sum(self.desired.get(rev, 0) for rev in self.plans) if self.desired else None
        return {"model": self.name, "provider": self.cfg.provider, "desired": desired,
                "panic": bool(self.scaler.last and self.scaler.last.panic), "stable": self.stable,
                "revisions": revisions,
                "in_flight": load.in_flight, "queued": load.waiting, "held": self.held,
                "unplaceable": self.unplaceable, "need": {"gpus": self.need.gpus,
                "gib": None if self.need.gib == float("inf") else self.need.gib},
                "replicas": [r.snapshot(self._in_flight(r)) for r in self.replicas.values()],
                "recent_failures": list(self.recent_failures), "decisions": list(self.decisions)[-5:]}
