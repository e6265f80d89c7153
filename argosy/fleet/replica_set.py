"""A model's replicas and their lifecycle: launch one of a revision, warm it up, route it once ready, drain
it, notice that it died and back off before the next. The scaling loop above it (ModelController)
decides how many of each revision run; a rollout (argosy.fleet.rollout) also launches and drains here.

    starting -> warming -> ready -> draining -> stopped     (failed: it died, or could not start)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections import deque
from collections.abc import Callable

import aiohttp

from argosy.config import ModelConfig, ResolvedRevision
from argosy.fleet.engine_args import engine_args
from argosy.fleet.metrics import FleetMetrics
from argosy.fleet.placement import Need, OutOfMemoryAtLoad, Placer, Unplaceable
from argosy.fleet.replica import DRAINING, FAILED, READY, STOPPED, WARMING, Replica, ReplicaSpec
from argosy.fleet.seams import GatewayPort, ModelRoutes, ReplicaProvider
from argosy.server.auth import API_KEY_ENV

log = logging.getLogger("argosy.fleet")
MAX_BACKOFF_S = 30.0


def how_it_ended(r: Replica) -> str:
    """' (killed by SIGKILL)' or ' (exit status 1)' where the provider's handle is a process, else ''. The
    detail after it is only the replica's last output line, which reads as if nothing went wrong
    ('argosy engine: ready, serving ...') when the kernel's OOM killer or an operator ended it."""
    code = getattr(r.handle, "returncode", None)
    if not isinstance(code, int):
        return ""
    if code >= 0:
        return f" (exit status {code})"
    try:
        return f" (killed by {signal.Signals(-code).name})"
    except ValueError:
        return f" (killed by signal {-code})"


class ReplicaSet:
    def __init__(self, cfg: ModelConfig, routes: ModelRoutes, gateway: GatewayPort, provider: ReplicaProvider,
                 placer: Placer, need: Need | Callable[[ResolvedRevision], Need], metrics: FleetMetrics,
                 clock=time.monotonic, otlp_endpoint: str | None = None, cpu_threads: int | None = None):
        # self.a: the model's own autoscaling fields: restart backoff, the loop's tick, the cold-start hold.
        self.cfg, self.a, self.routes, self.gateway, self.provider = cfg, cfg.autoscaling, routes, gateway, provider
        self.placer, self.m, self.clock = placer, metrics, clock
        self._need, self.needs = need, {}
        self.otlp_endpoint = otlp_endpoint  # the replicas continue the gateway's traces
        self.cpu_threads = cpu_threads  # a CPU replica's share of this machine's cores (fleet/local.py)
        self.name = cfg.name
        self.revisions = cfg.resolved()
        self.stable = cfg.stable_at_start()
        self.replicas: dict[str, Replica] = {}
        self.recent_failures: deque[dict] = deque(maxlen=10)
        self.routed = asyncio.Event()  # replaced each time a replica joins the routing set
        self.failures: dict[str, int] = {}  # per revision, since one of its replicas was last ready
        self.next_start_at: dict[str, float] = {}  # per revision: restart backoff
        self.unplaceable: str | None = None
        self.on_replica: Callable[[Replica, str], None] | None = None  # a rollout hears "ready" and "failed"

    def poke(self) -> None:
        """Ask the scaling loop for a tick now (ModelController)."""

    @property
    def need(self) -> Need:
        return self.need_for(self.stable)

    def need_for(self, revision: str) -> Need:
        """One replica's need (raises when the revision's checkpoint has no readable config.json)."""
        if revision not in self.needs:
            self.needs[revision] = self._need(self.revisions[revision]) if callable(self._need) else self._need
        return self.needs[revision]

    def ready_routed(self, revision: str | None = None) -> list[Replica]:
        return [r for r in self.replicas.values() if r.state == READY and not r.pooled
                and (revision is None or r.revision == revision)]

    def of(self, revision: str) -> list[Replica]:
        return [r for r in self.replicas.values() if r.revision == revision]

    def count(self, state: str, pooled: bool) -> int:
        """Replicas in one state, in the warm pool or not (argosy_fleet_replicas, read when scraped)."""
        return sum(1 for r in list(self.replicas.values()) if r.state == state and r.pooled == pooled)

    def launch(self, pooled: bool, rev: str | None = None) -> Replica | None:
        rev = rev or self.stable
        if self.clock() < self.next_start_at.get(rev, 0.0):
            return None  # backing off after a crash; the next tick tries again
        r = Replica(self.name, ReplicaSpec(self.name, "", []), pooled=pooled, revision=rev)
        try:
            need = self.need_for(rev)
        except (OSError, ValueError, KeyError) as e:  # no readable config.json: it cannot start
            self._refused(r, e)
            return None
        rc = self.revisions[rev]
        args = self.replica_args(rev, need)
        # The fleet's replica secret goes through the environment, never argv (`ps` shows argv to anyone).
        stages = rc.engine.pipeline_parallel_size if self.cfg.pipeline_across_nodes else 1
        r.spec = spec = ReplicaSpec(self.name, str(rc.checkpoint), args, stages=stages,
                                    env={API_KEY_ENV: self.gateway.upstream_auth.fleet_secret()})
        try:
            down = self.provider.down_nodes()
            if stages > 1:
                spec.placement = self.placer.place_stages(r.id, self.name, need, stages, self.cfg.provider, down)
            else:
                spec.placement = self.placer.place(r.id, self.name, need, self.cfg.provider, down)
        except Unplaceable as e:
            self.m.placement_failures.labels(self.name).inc()
            if self.unplaceable != str(e):
                log.warning(json.dumps({"event": "unplaceable", "model": self.name, "revision": rev,
                                        "reason": str(e)}))
            self.unplaceable = str(e)
            return None
        self.unplaceable = None
        self.replicas[r.id] = r
        log.info("fleet: %s: starting %s (revision %s)%s on %s", self.name, r.id, rev,
                 " (warm pool)" if pooled else "", spec.placement.node)
        r.task = asyncio.get_running_loop().create_task(self.run_replica(r))
        return r

    def replica_args(self, rev: str, need: Need) -> list[str]:
        """The `argosy engine` flags of a replica of this revision: the fleet file's engine section, the
        revision, the trace endpoint, and on the CPU the replica's share of the machine's cores."""
        rc = self.revisions[rev]
        args = engine_args(self.cfg.model_copy(update={"engine": rc.engine}), need.gpus > 0) + ["--revision", rev]
        if self.otlp_endpoint:  # the replica continues the gateway's traces
            args += ["--otlp-endpoint", self.otlp_endpoint]
        if self.cpu_threads is not None and need.gpus == 0 and "cpu_threads" not in rc.engine.model_fields_set:
            args += ["--cpu-threads", str(self.cpu_threads)]
        return args

    def _refused(self, r: Replica, e: Exception) -> None:
        r.state, r.detail = FAILED, f"cannot start: {e}"[-300:]
        delay = self._back_off(r.revision)
        log.warning(json.dumps({"event": "replica_failed", "model": self.name, "revision": r.revision,
                                "replica": r.id, "url": None, "detail": r.detail, "restart_in_s": round(delay, 2)}))
        self.recent_failures.append(r.snapshot())
        if self.on_replica is not None:
            self.on_replica(r, FAILED)

    def _in_flight(self, r: Replica) -> int:
        return self.routes.in_flight(r.url) if r.url else 0

    def route(self, r: Replica) -> None:
        self.routes.add_upstream(r.url, r.revision or None)
        ev, self.routed = self.routed, asyncio.Event()
        ev.set()

    async def run_replica(self, r: Replica) -> None:
        try:
            await self.provider.start(r)
            self.gateway.upstream_auth.register(r.url, r.spec.env[API_KEY_ENV])  # shown on every call to it
            r.state = WARMING
            while not await self._is_ready(r):
                if not self.provider.alive(r):
                    await self.provider.wait(r)  # it has ended: a provider may raise why (out of memory)
                    raise RuntimeError(f"exited while warming{how_it_ended(r)}: {r.detail[-200:]}")
                await asyncio.sleep(0.25)
            r.state, r.ready_at = READY, self.clock()
            self.failures[r.revision] = 0
            self.m.cold_start.labels(self.name).observe(r.ready_at - r.created)
            log.info("fleet: %s: %s (revision %s) ready at %s after %.1f s%s", self.name, r.id, r.revision, r.url,
                     r.ready_at - r.created, " (warm pool)" if r.pooled else "")
            if not r.pooled:
                self.route(r)
            if self.on_replica is not None:
                self.on_replica(r, READY)
            await self.provider.wait(r)
            if r.state == READY:
                raise RuntimeError(f"exited{how_it_ended(r)}: {r.detail[-200:]}")
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if r.state in (DRAINING, STOPPED):
                return
            await self._failed(r, e)

    async def _is_ready(self, r: Replica) -> bool:
        try:
            async with self.gateway.session.get(r.url + "/ready", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                await resp.read()
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def _failed(self, r: Replica, e: Exception) -> None:
        r.state, r.detail = FAILED, f"{type(e).__name__}: {e}"[-300:]
        if isinstance(e, OutOfMemoryAtLoad):  # the estimate was short: grow it, and try other GPUs first
            self.needs[r.revision] = e.corrected
            self.placer.note_oom(self.name, e.placement)
        delay = self._back_off(r.revision)
        self.m.restarts.labels(self.name).inc()
        log.warning(json.dumps({"event": "replica_failed", "model": self.name, "revision": r.revision,
                                "replica": r.id, "url": r.url, "detail": r.detail, "restart_in_s": round(delay, 2)}))
        self._forget(r)
        with contextlib.suppress(Exception):
            await self.provider.stop(r, 5.0)
        self.recent_failures.append(r.snapshot())
        if self.on_replica is not None:
            self.on_replica(r, FAILED)
        self.poke()

    def _back_off(self, rev: str) -> float:
        """The revision's next start waits restart_backoff_s x 2^(n-1), n its failures since a replica was ready."""
        n = self.failures[rev] = self.failures.get(rev, 0) + 1
        delay = min(self.a.restart_backoff_s * 2 ** (n - 1), MAX_BACKOFF_S)
        self.next_start_at[rev] = self.clock() + delay
        return delay

    def _forget(self, r: Replica) -> None:
        if r.url:
            self.routes.remove_upstream(r.url)
            self.gateway.forget_upstream(r.url)  # a later replica on the same port starts fresh
        self.placer.release(r.id)
        self.replicas.pop(r.id, None)

    async def drain(self, r: Replica, timeout: float | None = None) -> None:
        """Out of the routing set at once; its requests finish (bounded by drain_timeout_s); then stop."""
        if r.state in (DRAINING, STOPPED):
            return
        was_ready, r.state = r.state == READY, DRAINING
        if r.url:
            self.routes.remove_upstream(r.url)
        rc = self.revisions.get(r.revision)
        deadline = self.clock() + ((rc.autoscaling if rc else self.a).drain_timeout_s if timeout is None else timeout)
        if was_ready:
            while self._in_flight(r) > 0 and self.clock() < deadline:
                r.detail = f"draining: {self._in_flight(r)} in flight"
                await asyncio.sleep(0.1)
        log.info(json.dumps({"event": "replica_drained", "model": self.name, "revision": r.revision,
                             "replica": r.id, "url": r.url, "left_in_flight": self._in_flight(r)}))
        if r.task is not None and r.task is not asyncio.current_task():
            r.task.cancel()
        await self.provider.stop(r)
        r.state = STOPPED
        self._forget(r)

