"""Blue-green: the candidate (green) starts at the stable's full size beside it and takes no user
requests, only shadow copies (`blue_green.shadow_sample`) and requests that name it in the revision
header; pre-promotion analyses compare its shadow and preview requests with the stable's live ones.
After `analysis_passes` passes (or `promote`) all traffic moves in one switch. The old revision (blue)
stays warm for `scale_down_delay_s`: an abort then switches straight back; after it, blue drains.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from argosy.fleet.model_controller import Plan

if TYPE_CHECKING:
    from argosy.fleet.rollout.manager import RolloutManager


class BlueGreen:
    def __init__(self, mgr: RolloutManager):
        self.mgr, self.r = mgr, mgr.rollout

    @property
    def aborted_phase(self) -> str:
        return "switched_back" if self.r.switched_at is not None else "aborted"

    def can_abort(self) -> bool:
        return True  # before the switch: the preview goes; after it (while blue is warm): switch back

    async def run(self) -> None:
        m, r, bg = self.mgr, self.r, self.mgr.cfg.blue_green
        cand, old = r.to_revision, r.from_revision
        if r.phase in ("starting", "analysing"):
            m.mc.plans[cand] = Plan(fixed=r.size)
            m.mc.poke()
            m.routes.set_rollout(cand, bg.shadow_sample, shadow_feeds_analysis=True)
            await m.wait_ready(cand, r.size)
            if r.phase == "starting":
                r.phase = "analysing"
                m.event("preview_ready", replicas=r.size)
                await m.save()
            await self.analyse_until_promoted()
            await self.switch()
        m.mc.plans[old] = Plan(fixed=r.size)  # warm (again, after a restart) until the delay is over
        m.mc.plans.setdefault(cand, Plan(floor=r.size))
        m.mc.poke()
        while r.paused or time.time() - r.switched_at < bg.scale_down_delay_s:
            await m.sleep(min(1.0, max(0.05, bg.scale_down_delay_s - (time.time() - r.switched_at))))
        await asyncio.gather(*m.mc.retire(old), return_exceptions=True)
        m.mc.plans[cand] = Plan()
        m.event("old_drained", revision=old)
        r.reason = "switched"
        m.finish("succeeded")
        await m.save()

    async def analyse_until_promoted(self) -> None:
        m, r, bg, a = self.mgr, self.r, self.mgr.cfg.blue_green, self.mgr.cfg.analysis
        next_at = time.monotonic() + a.interval_s
        while True:
            now = time.monotonic()
            if r.promote_requested:
                m.event("promote_forced", passes=r.passed_in_step)
                return
            if a.gates and now >= next_at:
                m.analyse(include_shadow=True)  # raises RolloutAborted at failure_limit
                next_at = max(next_at + a.interval_s, now)
                await m.save()
            passed = not a.gates or r.passed_in_step >= bg.analysis_passes
            if passed and bg.auto_promote and not r.paused:
                return
            await m.sleep(min(max(next_at - now, 0.05), 1.0))

    async def switch(self) -> None:
        m, r = self.mgr, self.r
        cand, old = r.to_revision, r.from_revision
        m.mc.plans[cand] = Plan(floor=r.size)
        m.mc.plans[old] = Plan(fixed=r.size)
        m.set_stable(cand)
        m.apply_split({cand: 100.0, old: 0.0})
        m.routes.set_rollout(None)
        r.phase, r.switched_at, r.weight = "switched", time.time(), 100
        m.event("switched", weight=100, old_warm_for_s=m.cfg.blue_green.scale_down_delay_s)
        await m.save()

    def abort_now(self) -> None:
        m, r = self.mgr, self.r
        if r.switched_at is not None:  # traffic straight back to the warm old revision
            m.set_stable(r.from_revision)
            m.apply_split({r.from_revision: 100.0, r.to_revision: 0.0})
            m.mc.plans[r.from_revision] = Plan(floor=r.size)
            m.event("switched_back", weight=0)
        r.weight = 0
        m.routes.set_rollout(None)

    async def roll_back(self) -> None:
        m, r = self.mgr, self.r
        await asyncio.gather(*m.mc.retire(r.to_revision), return_exceptions=True)
        m.mc.plans[r.from_revision] = Plan()
        m.apply_split({r.from_revision: 100.0})
        m.event("candidate_drained", revision=r.to_revision)
