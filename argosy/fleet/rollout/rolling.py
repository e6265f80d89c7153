"""Rolling, without spare capacity: one replica at a time, the old revision's replica drains (no new
requests; its streams finish), stops, and a replica of the new revision starts in its place (so the
placer finds the room the old one left) and must become ready before the next. Meanwhile requests go
to the replicas still serving, by their count per revision; a model left with none (one replica) holds
them at the gateway as a scale from zero does, until the new replica is ready. The model's autoscaling
waits for the upgrade to end. An abort replaces the new revision's replicas with old ones the same way.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from argosy.fleet.model_controller import Plan
from argosy.fleet.replica import FAILED, LIVE, READY, Replica
from argosy.fleet.rollout.state import RolloutAborted

if TYPE_CHECKING:
    from argosy.fleet.rollout.manager import RolloutManager


class Rolling:
    aborted_phase = "aborted"

    def __init__(self, mgr: RolloutManager):
        self.mgr, self.r = mgr, mgr.rollout

    def can_abort(self) -> bool:
        return True

    def rebalance(self) -> None:
        """Weights follow the ready replicas of each revision."""
        mc, r = self.mgr.mc, self.r
        n_old, n_new = len(mc.ready_routed(r.from_revision)), len(mc.ready_routed(r.to_revision))
        if n_old + n_new:
            self.r.weight = round(100 * n_new / (n_old + n_new), 2)
            self.mgr.apply_split({r.from_revision: 100 - self.r.weight, r.to_revision: self.r.weight})

    def on_replica(self, rep: Replica, state: str) -> None:
        if state == READY:
            self.rebalance()

    async def run(self) -> None:
        m, r, mc = self.mgr, self.r, self.mgr.mc
        old, new = r.from_revision, r.to_revision
        m.routes.set_rollout(new)
        if r.phase == "starting":
            await m.wait_ready(old, r.size)
            r.phase = "progressing"
            await m.save()
        elif not mc.of(new) and r.replaced:  # resumed after a restart: the mix it had, started again
            mc.plans = {old: Plan(fixed=r.size - r.replaced), new: Plan(fixed=r.replaced)}
            mc.poke()
            await m.wait_ready(new, r.replaced)
            await m.wait_ready(old, r.size - r.replaced)
        mc.frozen = True
        self.rebalance()
        while r.replaced < r.size:
            while r.paused:
                await m.sleep(1.0)
            victims = sorted(mc.ready_routed(old), key=mc._in_flight)
            if not victims:
                raise RolloutAborted(f"no ready replica of revision {old} left to replace")
            rep = await self.replace(victims[0], new)
            r.replaced += 1
            m.event("replica_replaced", old=victims[0].id, new=rep.id, done=r.replaced, of=r.size)
            await m.save()
        m.set_stable(new)
        m.apply_split({new: 100.0})
        mc.plans = {new: Plan()}
        mc.frozen = False
        r.weight, r.reason = 100, "all replicas replaced"
        m.finish("succeeded")
        await m.save()

    async def replace(self, victim: Replica, revision: str) -> Replica:
        """Drain and stop one replica, start one of `revision` in its place, wait until it is ready."""
        m, mc = self.mgr, self.mgr.mc
        mc.expecting += 1  # from the drain on, a request with no replica left is held, not refused
        try:
            m.event("replica_draining", replica=victim.id, revision=victim.revision, in_flight=mc._in_flight(victim))
            await mc.drain(victim)
            self.rebalance()
            rep = mc.launch(pooled=False, rev=revision)
            if rep is None:
                raise RolloutAborted(f"revision {revision}: cannot start a replica ({mc.unplaceable or 'see the log'})")
        finally:
            mc.expecting -= 1
        deadline = time.monotonic() + m.cfg.ready_timeout_s
        while rep.state != READY:
            if rep.state == FAILED or rep.id not in mc.replicas:
                raise RolloutAborted(f"revision {revision} failed to start: {rep.detail}")
            if time.monotonic() > deadline:
                raise RolloutAborted(f"revision {revision}: not ready within {m.cfg.ready_timeout_s:g} s")
            await m.sleep(0.25)
        self.rebalance()
        return rep

    def abort_now(self) -> None:
        self.mgr.mc.expecting += 1  # the roll back starts old replicas: hold requests meanwhile

    async def roll_back(self) -> None:
        m, r, mc = self.mgr, self.r, self.mgr.mc
        old, new = r.from_revision, r.to_revision
        mc.frozen = True
        try:
            for rep in [x for x in mc.of(new) if x.state in LIVE]:
                await self.replace(rep, old)
            while len([x for x in mc.of(old) if x.state in LIVE]) < r.size:
                mc.expecting += 1
                try:
                    rep = mc.launch(pooled=False, rev=old)
                finally:
                    mc.expecting -= 1
                if rep is None:
                    break
                await m.wait_ready(old, len(mc.ready_routed(old)) + 1)
        except Exception as e:  # the roll back itself failed: the autoscaler takes over the old revision
            m.event("roll_back_incomplete", error=f"{type(e).__name__}: {e}")
        finally:
            mc.expecting -= 1
        m.apply_split({old: 100.0})
        mc.plans = {old: Plan()}
        mc.frozen = False
        m.event("rolled_back", replicas=len(mc.ready_routed(old)))
