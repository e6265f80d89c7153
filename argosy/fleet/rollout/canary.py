"""Canary: the candidate takes a growing share of requests, step by step, while an analysis compares it
with the stable revision every interval; then it takes all of them and the old revision drains.

Each step sets the candidate's weight and its replicas to at least weight% of the stable's count (at
least one), then holds for `pause_s` (or until `promote` for a manual step). A timed step moves on only
once an analysis at it passed (`analysis.require_pass`): a quiet window is inconclusive, never a pass.
`failure_limit` failed analyses abort: the weight goes to 0 at once, the candidate's replicas drain.
After the last step the candidate is scaled to the stable's size, takes 100%, and the old drains.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING

from argosy.config_rollout import CanaryStep
from argosy.fleet.model_controller import Plan

if TYPE_CHECKING:
    from argosy.fleet.rollout.manager import RolloutManager


class Canary:
    aborted_phase = "aborted"

    def __init__(self, mgr: RolloutManager):
        self.mgr, self.r = mgr, mgr.rollout

    def size_for(self, weight: float) -> int:
        return max(1, math.ceil(self.r.size * weight / 100))

    def can_abort(self) -> bool:
        return self.mgr.state.stable != self.r.to_revision

    def set_weight(self, weight: float) -> None:
        self.r.weight = weight
        self.mgr.apply_split({self.r.from_revision: 100 - weight, self.r.to_revision: weight})

    async def run(self) -> None:
        m, r = self.mgr, self.r
        steps = m.cfg.steps
        m.routes.set_rollout(r.to_revision, m.cfg.shadow.sample)
        m.mc.plans[r.to_revision] = Plan(floor=self.size_for(steps[min(r.step, len(steps) - 1)].weight))
        m.mc.poke()
        await m.wait_ready(r.to_revision, 1)
        if r.phase == "starting":
            r.phase = "progressing"
            m.event("candidate_ready", replicas=len(m.mc.ready_routed(r.to_revision)))
        while r.step < len(steps) and not r.full_promote:
            step = steps[r.step]
            m.mc.plans[r.to_revision] = Plan(floor=self.size_for(step.weight))
            m.mc.poke()
            self.set_weight(step.weight)
            m.event("step", step=r.step, weight=step.weight, pause_s=step.pause_s, manual=step.manual)
            await m.save()
            await self.hold(step)
            r.step, r.step_elapsed_s, r.passed_in_step = r.step + 1, 0.0, 0
            await m.save()
        await self.promote()

    async def hold(self, step: CanaryStep) -> None:
        """Stay at this step (analysing each interval) until its pause is over and an analysis passed, or
        until `promote`."""
        m, r, a = self.mgr, self.r, self.mgr.cfg.analysis
        next_at = last = time.monotonic()
        next_at += a.interval_s
        while True:
            now = time.monotonic()
            if not r.paused:
                r.step_elapsed_s += now - last
            last = now
            if r.promote_requested or r.full_promote:
                r.promote_requested = False
                m.event("step_promoted", step=r.step, full=r.full_promote)
                return
            if a.gates and now >= next_at:
                m.analyse()  # raises RolloutAborted at failure_limit
                next_at = max(next_at + a.interval_s, now)
                await m.save()
            timed_out = not r.paused and step.pause_s is not None and r.step_elapsed_s >= step.pause_s
            if timed_out and (not a.gates or not a.require_pass or r.passed_in_step > 0):
                return
            wait = next_at - now if a.gates else 1.0
            if step.pause_s is not None and not r.paused:
                wait = min(wait, step.pause_s - r.step_elapsed_s)
            await m.sleep(min(max(wait, 0.05), 1.0))

    async def promote(self) -> None:
        m, r = self.mgr, self.r
        cand, old = r.to_revision, r.from_revision
        r.phase = "promoting"
        m.event("promoting", replicas=r.size)
        await m.save()
        m.mc.plans[cand] = Plan(floor=r.size)  # as many as the stable ran, before it takes everything
        m.mc.poke()
        await m.wait_ready(cand, r.size)
        m.set_stable(cand)
        self.set_weight(100)
        m.apply_split({cand: 100.0})
        m.routes.set_rollout(None)
        m.event("promoted", weight=100)
        await m.save()
        await asyncio.gather(*m.mc.retire(old), return_exceptions=True)  # the old drains: streams finish
        m.mc.plans[cand] = Plan()
        m.event("old_drained", revision=old)
        r.reason = "promoted"
        m.finish("succeeded")
        await m.save()

    def abort_now(self) -> None:
        m, r = self.mgr, self.r
        r.weight = 0
        m.apply_split({r.from_revision: 100.0})
        m.routes.set_rollout(None)

    async def roll_back(self) -> None:
        await asyncio.gather(*self.mgr.mc.retire(self.r.to_revision), return_exceptions=True)
        self.mgr.event("candidate_drained", revision=self.r.to_revision)
