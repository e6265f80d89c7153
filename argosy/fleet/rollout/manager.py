"""One model's rollouts: the commands (start, promote, pause, resume, abort), the driver task that runs
the strategy, the analysis each interval, and every change written to the state store before it counts.

The manager owns the model's ModelState (stable revision, split, the rollout). It drives the model's
controller (which revisions run, at what size: ModelController.plans) and the gateway's routes (the
split, the candidate's shadow and header selection, the per-revision samples). A restart builds a new
manager, `restore()` reads the state back and the strategy resumes from the phase and step it was at.
Events go to the log as JSON lines ({"event": "rollout_...", ...}) and to the rollout's own list.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from argosy.config_rollout import STRATEGIES, RolloutConfig
from argosy.fleet.model_controller import ModelController, Plan
from argosy.fleet.replica import FAILED, READY, Replica
from argosy.fleet.rollout.analysis import FAIL, PASS, AnalysisResult, Side, evaluate
from argosy.fleet.rollout.metrics import RolloutMetrics
from argosy.fleet.rollout.state import MAX_EVENTS, ModelState, Rollout, RolloutAborted
from argosy.fleet.rollout.store import StateStore
from argosy.gateway.errors import GatewayError, bad_request
from argosy.gateway.revision_stats import LIVE, SHADOW, WindowStats

if TYPE_CHECKING:
    from argosy.fleet.seams import ModelRoutes

log = logging.getLogger("argosy.fleet")


def conflict(message: str) -> GatewayError:
    return GatewayError(409, message, "invalid_request_error", "rollout_conflict")


class RolloutManager:
    def __init__(self, mc: ModelController, routes: ModelRoutes, store: StateStore, metrics: RolloutMetrics,
                 cfg: RolloutConfig):
        self.mc, self.routes, self.store, self.m, self.cfg = mc, routes, store, metrics, cfg
        self.name = mc.name
        self.state = ModelState(mc.name, mc.stable, {mc.stable: 100.0})
        self.task: asyncio.Task | None = None
        self.strategy: Any = None
        self.wake = asyncio.Event()
        self.failed: dict[str, str] = {}  # revision -> its replica's failure, during a rollout
        self.aborting = False
        mc.on_replica = self.on_replica

    @property
    def rollout(self) -> Rollout | None:
        return self.state.rollout

    # ------------------------------------------------------------------ state

    async def restore(self) -> None:
        """Read the stored state: the stable revision and split, and a rollout to resume."""
        raw = await self.store.load(self.name)
        if raw is None:
            return  # nothing stored: the fleet file says it all (written at the first rollout)
        st = ModelState.from_dict(raw)
        if st.stable not in self.mc.revisions:
            log.warning(json.dumps({"event": "rollout_state_ignored", "model": self.name, "reason":
                                    f"stable revision {st.stable!r} is not in the fleet file"}))
            return
        self.state = st
        self.mc.stable = st.stable
        self.mc.plans = {st.stable: Plan()}
        r = st.rollout
        if r is not None and not r.done and r.to_revision not in self.mc.revisions:
            r.phase, r.reason, r.finished_at = "aborted", f"revision {r.to_revision!r} left the fleet file", time.time()
            st.finish()
        live = {k: v for k, v in st.split.items() if k in self.mc.revisions and (r and not r.done or k == st.stable)}
        self.apply_split(live or {st.stable: 100.0})
        if r is not None and not r.done:
            self.event("restored", phase=r.phase, step=r.step, weight=r.weight)  # after a restart
            self._start_driver()
        await self.save()

    async def save(self) -> None:
        try:
            await self.store.save(self.name, self.state.as_dict())
        except Exception as e:  # the rollout goes on; the next save may succeed (Redis back, disk freed)
            log.error(json.dumps({"event": "rollout_state_not_saved", "model": self.name,
                                  "error": f"{type(e).__name__}: {e}"}))

    def apply_split(self, split: dict[str, float]) -> None:
        self.state.split = {k: round(float(v), 4) for k, v in split.items()}
        self.mc.split = dict(self.state.split)
        self.routes.set_split(self.state.split, self.state.stable)

    def set_stable(self, revision: str) -> None:
        self.state.stable = self.mc.stable = revision

    def event(self, kind: str, **fields: Any) -> None:
        r = self.rollout
        entry = {"event": f"rollout_{kind}", "model": self.name, "at": time.strftime("%H:%M:%S")}
        if r is not None:
            entry.update(rollout=r.id, strategy=r.strategy, to=r.to_revision)
        entry.update(fields)
        log.info(json.dumps(entry))
        if r is not None:
            r.events = [*r.events, {k: v for k, v in entry.items() if k not in ("model", "rollout", "strategy")}]
            r.events = r.events[-MAX_EVENTS:]

    # ------------------------------------------------------------------ commands

    async def start(self, to: str, strategy: str | None, cfg: RolloutConfig | None = None) -> dict:
        if self.rollout is not None and not self.rollout.done:
            raise conflict(f"model {self.name!r} has a rollout in progress ({self.rollout.strategy} to "
                           f"{self.rollout.to_revision}, {self.rollout.phase}); abort it first")
        if to not in self.mc.revisions:
            raise bad_request(f"model {self.name!r} has no revision {to!r} (revisions: "
                              f"{', '.join(self.mc.revisions)}); add it to the fleet file's revisions", "to")
        if to == self.state.stable:
            raise conflict(f"revision {to!r} is already the stable revision of {self.name!r}")
        self.cfg = cfg or self.cfg
        strategy = strategy or self.cfg.strategy
        if strategy not in STRATEGIES:
            raise bad_request(f"unknown strategy {strategy!r} ({', '.join(STRATEGIES)})", "strategy")
        if strategy == "canary" and self.cfg.uses_agreement() and self.cfg.shadow.sample == 0:
            raise bad_request("the shadow_agreement gate needs rollout.shadow.sample > 0 for a canary", "strategy")
        try:
            self.mc.need_for(to)
        except (OSError, ValueError, KeyError) as e:
            raise bad_request(f"revision {to!r}: cannot read its checkpoint's config.json ({e})", "to") from None
        size = max(1, len([r for r in self.mc.of(self.state.stable) if not r.pooled and r.state in
                           ("starting", "warming", "ready")]))
        rid = f"{self.name}-{to}-{time.strftime('%Y%m%dT%H%M%S')}"
        self.state.rollout = Rollout(rid, strategy, self.state.stable, to, size)
        self.failed.pop(to, None)
        self.aborting = False
        self.event("started", size=size, **{"from": self.state.stable})
        await self.save()
        self._start_driver()
        return self.status()

    async def promote(self, full: bool = False) -> dict:
        r = self._active()
        if r.strategy == "rolling":
            raise conflict("a rolling upgrade has no step to promote: it replaces one replica after another")
        if r.phase in ("promoting", "switched"):
            raise conflict(f"the rollout is already {r.phase}")
        r.promote_requested, r.full_promote = True, r.full_promote or full
        self.event("promote_requested", full=full)
        await self.save()
        self.wake.set()
        return self.status()

    async def pause(self, paused: bool = True) -> dict:
        r = self._active()
        r.paused = paused
        self.event("paused" if paused else "resumed")
        await self.save()
        self.wake.set()
        return self.status()

    async def abort(self, reason: str = "aborted by an operator") -> dict:
        r = self._active()
        if not self.strategy.can_abort():
            raise conflict(f"the {r.strategy} rollout to {r.to_revision} has switched all traffic; it can no "
                           "longer be aborted (start a rollout back instead)")
        await self._abort(reason)
        return self.status()

    def _active(self) -> Rollout:
        r = self.rollout
        if r is None or r.done:
            raise conflict(f"model {self.name!r} has no rollout in progress")
        return r

    # ------------------------------------------------------------------ the driver

    def _start_driver(self) -> None:
        from argosy.fleet.rollout.strategies import strategy_for

        self.strategy = strategy_for(self)
        self.task = asyncio.get_running_loop().create_task(self._drive())

    async def _drive(self) -> None:
        try:
            await self.strategy.run()
        except RolloutAborted as e:
            await self._abort(str(e), from_driver=True)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug must not leave half a rollout: roll it back, say why
            log.exception("fleet: %s: rollout failed", self.name)
            await self._abort(f"internal error: {type(e).__name__}: {e}", from_driver=True)

    async def _abort(self, reason: str, from_driver: bool = False) -> None:
        r = self.rollout
        if self.aborting or r is None or r.done:
            return
        self.aborting = True
        self.strategy.abort_now()  # at once: the candidate gets no more requests
        r.reason = reason
        self.event("aborting", reason=reason)
        await self.save()
        if not from_driver and self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if not from_driver:
            self.task = asyncio.get_running_loop().create_task(self._roll_back())
        else:
            await self._roll_back()

    async def _roll_back(self) -> None:
        await self.strategy.roll_back()
        self.finish(self.strategy.aborted_phase)
        await self.save()

    def finish(self, phase: str) -> None:
        r = self.rollout
        r.phase, r.finished_at = phase, time.time()
        self.routes.set_rollout(None)
        self.mc.frozen, self.mc.expecting = False, 0
        self.event(phase, reason=r.reason, took_s=round(r.finished_at - r.started_at, 1))
        self.m.finished.labels(self.name, r.strategy, phase).inc()
        self.m.duration.labels(r.strategy, phase).observe(r.finished_at - r.started_at)
        self.state.finish()

    def on_replica(self, rep: Replica, state: str) -> None:
        """The controller's news of a replica: a candidate's failure aborts the rollout."""
        r = self.rollout
        if r is None or r.done:
            return
        if self.strategy is not None and hasattr(self.strategy, "on_replica"):
            self.strategy.on_replica(rep, state)
        if state == FAILED and rep.revision == r.to_revision and not self.aborting:
            self.failed[rep.revision] = rep.detail
            reason = f"revision {rep.revision} failed: replica {rep.id}: {rep.detail}"
            asyncio.get_running_loop().create_task(self._abort(reason))
        elif state == READY:
            self.wake.set()

    async def stop(self) -> None:
        """The controller stops: the driver ends where it is (the state says where; a restart resumes)."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.save()

    # ------------------------------------------------------------------ what strategies use

    async def sleep(self, seconds: float) -> None:
        """Wait up to `seconds`, less if a command (or a replica becoming ready) wakes the driver."""
        self.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), max(seconds, 0.0))

    async def wait_ready(self, revision: str, n: int) -> None:
        """Until `n` replicas of the revision are ready and routed; RolloutAborted if one fails or time runs out."""
        deadline = time.monotonic() + self.cfg.ready_timeout_s
        while len(self.mc.ready_routed(revision)) < n:
            if revision in self.failed:
                raise RolloutAborted(f"revision {revision} failed to start: {self.failed[revision]}")
            if time.monotonic() > deadline:
                raise RolloutAborted(f"revision {revision}: {n} replica(s) not ready within "
                                     f"{self.cfg.ready_timeout_s:g} s")
            await self.sleep(0.25)

    def analyse(self, include_shadow: bool = False) -> AnalysisResult:
        """The candidate against the stable over the interval just past; counted, logged and kept."""
        r, a = self.rollout, self.cfg.analysis
        t1 = time.monotonic()
        t0 = t1 - a.interval_s
        win = self.routes.window(t0, t1)
        cand = win.get((r.to_revision, LIVE), WindowStats())
        if include_shadow:
            cand = cand.merge(win.get((r.to_revision, SHADOW), WindowStats()))
        stable = win.get((r.from_revision, LIVE), WindowStats())
        agreement, pairs = self.routes.agreement(r.to_revision, t0, t1)
        res = evaluate(a.gates, Side(cand, len(self.mc.ready_routed(r.to_revision)), agreement, pairs),
                       Side(stable, len(self.mc.ready_routed(r.from_revision))), a.interval_s, a.min_samples)
        r.analyses[res.verdict] = r.analyses.get(res.verdict, 0) + 1
        r.last_analysis = res.as_dict()
        if res.verdict == PASS:
            r.passed_in_step += 1
        self.m.analyses.labels(self.name, r.strategy, res.verdict).inc()
        self.event("analysis", verdict=res.verdict, weight=r.weight, gates=res.story())
        if res.verdict == FAIL and r.analyses[FAIL] >= a.failure_limit:
            raise RolloutAborted(f"{r.analyses[FAIL]} failed analyses (failure_limit {a.failure_limit}); "
                                 f"last: {res.story()}")
        return res

    def status(self) -> dict:
        st = self.state
        out = {"model": self.name, "stable": st.stable, "split": st.split, "history": st.history,
               "rollout": None}
        if st.rollout is not None:
            r = st.rollout
            out["rollout"] = {**{k: v for k, v in vars(r).items() if k != "events"}, "events": r.events[-20:]}
        return out
