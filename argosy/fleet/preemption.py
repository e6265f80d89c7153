"""Preemption notices: spot capacity taken back with a warning (docs/regions.md).

A notice names a node and how long is left (AWS gives two minutes, GCP thirty seconds). It arrives by the
admin API (POST /admin/preempt {"node", "deadline_s"}: a cloud's termination handler, an operator, a test)
or from a provider that learns of it itself (one that has `preemption_notices()`, an async iterator of
PreemptionNotice: a cloud metadata endpoint, a Kubernetes node taint).

On a notice the node is cordoned (nothing new is placed there) and each replica on it drains at once: out
of the routing set, its streams given until the deadline (at most the model's drain_timeout_s), then
stopped. Its model controller is poked, and its reconcile loop starts the replacement right away, placed
in capacity order on the nodes left: spot elsewhere or on-demand, as the order says (SkyServe's fallback).
The node stays cordoned until POST /admin/preempt {"node", "restore": true} (or the provider's notice of
its return).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from argosy.fleet.replica import LIVE

if TYPE_CHECKING:
    from argosy.fleet.controller import Controller

log = logging.getLogger("argosy.fleet")


@dataclass(frozen=True)
class PreemptionNotice:
    node: str
    deadline_s: float  # seconds left when the notice was given
    source: str = "provider"
    restore: bool = False  # the node is back (capacity returned)


class Preemptions:
    def __init__(self, controller: Controller):
        self.controller = controller
        self.notices: dict[str, dict] = {}  # node -> what was noticed and done
        self.tasks: set[asyncio.Task] = set()

    def apply(self, notice: PreemptionNotice) -> dict:
        placer = self.controller.placer
        if placer is None or notice.node not in placer.nodes:
            known = ", ".join(placer.nodes) if placer else "none yet"
            raise KeyError(f"no node {notice.node!r} (nodes: {known})")
        if notice.restore:
            placer.cordoned.discard(notice.node)
            self.notices.pop(notice.node, None)
            log.info(json.dumps({"event": "node_restored", "node": notice.node, "source": notice.source}))
            for mc in self.controller.models.values():
                mc.poke()
            return {"node": notice.node, "restored": True}
        placer.cordoned.add(notice.node)
        drained = []
        for mc in self.controller.models.values():
            for r in list(mc.replicas.values()):
                if r.node == notice.node and r.state in LIVE:
                    timeout = min(notice.deadline_s, mc.a.drain_timeout_s)
                    t = asyncio.get_running_loop().create_task(mc.drain(r, timeout=timeout))
                    self.tasks.add(t)
                    t.add_done_callback(self.tasks.discard)
                    drained.append({"model": mc.name, "replica": r.id})
            mc.poke()  # the reconcile loop replaces what drains, on the nodes left
        entry = {"node": notice.node, "deadline_s": notice.deadline_s, "source": notice.source,
                 "at": time.strftime("%H:%M:%S"), "draining": drained}
        self.notices[notice.node] = entry
        log.warning(json.dumps({"event": "preemption_notice", **entry}))
        return entry

    async def follow(self, provider_name: str, notices) -> None:
        """Apply a provider's own notices as they come."""
        async for n in notices:
            try:
                self.apply(n)
            except KeyError as e:
                log.warning("fleet: %s: preemption notice for an unknown node: %s", provider_name, e)

    def start(self, providers: dict) -> None:
        for name, p in providers.items():
            source = getattr(p, "preemption_notices", None)
            if source is not None:
                t = asyncio.get_running_loop().create_task(self.follow(name, source()))
                self.tasks.add(t)
                t.add_done_callback(self.tasks.discard)

    async def stop(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
