"""One model's reconcile loop: observe load, ask the autoscaler, start, promote, drain and replace replicas."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque

import aiohttp

from argosy.config import ModelConfig
from argosy.fleet.autoscaler import Autoscaler, Decision, Observation
from argosy.fleet.engine_args import engine_args
from argosy.fleet.metrics import FleetMetrics
from argosy.fleet.placement import Need, OutOfMemoryAtLoad, Placer, Unplaceable
from argosy.fleet.replica import DRAINING, FAILED, LIVE, READY, STARTING, STOPPED, WARMING, Replica, ReplicaSpec
from argosy.fleet.seams import GatewayPort, ModelRoutes, ReplicaProvider
from argosy.gateway.errors import unavailable
from argosy.gateway.scraper import ReplicaGauges
from argosy.server.auth import API_KEY_ENV

log = logging.getLogger("argosy.fleet")
MAX_BACKOFF_S = 30.0


class ModelController:
    def __init__(self, cfg: ModelConfig, routes: ModelRoutes, gateway: GatewayPort, provider: ReplicaProvider,
                 placer: Placer, need: Need, metrics: FleetMetrics, clock=time.monotonic,
                 otlp_endpoint: str | None = None):
        self.cfg, self.a, self.routes, self.gateway, self.provider = cfg, cfg.autoscaling, routes, gateway, provider
        self.placer, self.need, self.m, self.clock = placer, need, metrics, clock
        self.otlp_endpoint = otlp_endpoint  # the replicas continue the gateway's traces
        self.name = cfg.name
        self.scaler = Autoscaler(self.a, clock)
        self.replicas: dict[str, Replica] = {}
        self.recent_failures: deque[dict] = deque(maxlen=10)
        self.decisions: deque[dict] = deque(maxlen=20)
        self.wake = asyncio.Event()
        self.routed = asyncio.Event()  # replaced each time a replica joins the routing set
        self.failures, self.next_start_at = 0, 0.0
        self.unplaceable: str | None = None
        self.held = 0
        self.done_counts: dict[str, int] = {}
        self.last_obs_t = clock()
        self.task: asyncio.Task | None = None
        routes.set_activator(self.activate)
        metrics.watch(self)

    # ------------------------------------------------------------------ loop

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

    def ready_routed(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.state == READY and not r.pooled]

    async def tick(self) -> None:
        ready = self.ready_routed()
        gauges = None
        if self.scaler.metric.needs_scrape:
            gauges = await self.gateway.scraper.refresh(r.url for r in ready if r.url)
        self.scaler.observe(self.observe(ready, gauges), len(ready))
        active = [r for r in self.replicas.values() if not r.pooled and r.state in LIVE]
        d = self.scaler.decide(len(ready), len(active))
        self.record(d)
        self.reconcile(d.desired)

    def observe(self, ready: list[Replica], gauges: dict[str, ReplicaGauges] | None = None) -> Observation:
        """What the autoscaler sees: the gateway's admission load, the finished-request rate and, when
        the metric needs them, the ready replicas' scraped queue and KV usage (`gauges` by URL)."""
        now = self.clock()
        load = self.routes.admission_load()
        total = 0
        for r in self.replicas.values():
            n = self.routes.finished(r.url) if r.url else None
            if n is not None:
                total += n - self.done_counts.get(r.url, n)  # new replicas count from now
                self.done_counts[r.url] = n
        dt, self.last_obs_t = max(now - self.last_obs_t, 1e-3), now
        scraped = [g for r in ready if (g := (gauges or {}).get(r.url or "")) is not None]
        kv = sum(g.kv_usage for g in scraped) / len(scraped) if scraped else 0.0
        return Observation(concurrency=load.in_flight + load.waiting, rps=total / dt,
                           queue=load.waiting + sum(g.waiting for g in scraped), kv_cache=kv, tokens=load.tokens)

    def record(self, d: Decision) -> None:
        prev = self.decisions[-1] if self.decisions else None
        self.m.decisions.labels(self.name, d.direction, d.kind).inc()
        self.m.desired.labels(self.name).set(d.desired)
        self.m.panic.labels(self.name).set(1 if d.panic else 0)
        self.m.observed.labels(self.name, "stable").set(d.stable_value)
        self.m.observed.labels(self.name, "panic").set(d.panic_value)
        changed = prev is None or prev["desired"] != d.desired or prev["panic"] != d.panic
        if d.direction != "hold" or changed:
            entry = {"event": "scale_decision", "model": self.name, "at": time.strftime("%H:%M:%S"), **d.as_dict()}
            self.decisions.append(entry)
            log.info(json.dumps(entry))

    def count(self, state: str, pooled: bool) -> int:
        """Replicas in one state, in the warm pool or not (argosy_fleet_replicas, read when scraped)."""
        return sum(1 for r in list(self.replicas.values()) if r.state == state and r.pooled == pooled)

    # ------------------------------------------------------------------ reconcile

    def reconcile(self, desired: int) -> None:
        active = [r for r in self.replicas.values() if not r.pooled and r.state in LIVE]
        pool = sorted((r for r in self.replicas.values() if r.pooled and r.state in LIVE),
                      key=lambda r: r.state != READY)  # ready ones first
        for _ in range(desired - len(active)):
            if pool:  # the warm pool takes traffic the moment it is needed
                r = pool.pop(0)
                r.pooled = False
                log.info("fleet: %s: %s promoted from the warm pool (%s)", self.name, r.id, r.state)
                if r.state == READY:
                    self.route(r)
            elif not self.launch(pooled=False):
                break
        if desired < len(active):
            order = {STARTING: 0, WARMING: 1, READY: 2}
            victims = sorted(active, key=lambda r: (order[r.state], self._in_flight(r), -r.created))
            for r in victims[:len(active) - desired]:
                asyncio.get_running_loop().create_task(self.drain(r))
        for _ in range(self.a.warm_pool - len(pool)):
            if not self.launch(pooled=True):
                break
        for r in pool[self.a.warm_pool:]:
            asyncio.get_running_loop().create_task(self.drain(r))

    def launch(self, pooled: bool) -> bool:
        if self.clock() < self.next_start_at:
            return False  # backing off after a crash; the next tick tries again
        args = engine_args(self.cfg, self.need.gpus > 0) + ["--revision", self.cfg.revision]
        if self.otlp_endpoint:  # the replica continues the gateway's traces
            args += ["--otlp-endpoint", self.otlp_endpoint]
        # The fleet's replica secret goes through the environment, never argv (`ps` shows argv to anyone).
        spec = ReplicaSpec(self.name, str(self.cfg.checkpoint), args,
                           env={API_KEY_ENV: self.gateway.upstream_auth.fleet_secret()})
        r = Replica(self.name, spec, pooled=pooled)
        try:
            down = self.provider.down_nodes()
            spec.placement = self.placer.place(r.id, self.name, self.need, self.cfg.provider, down)
        except Unplaceable as e:
            self.m.placement_failures.labels(self.name).inc()
            if self.unplaceable != str(e):
                log.warning(json.dumps({"event": "unplaceable", "model": self.name, "reason": str(e)}))
            self.unplaceable = str(e)
            return False
        self.unplaceable = None
        self.replicas[r.id] = r
        log.info("fleet: %s: starting %s%s on %s", self.name, r.id, " (warm pool)" if pooled else "",
                 spec.placement.node)
        r.task = asyncio.get_running_loop().create_task(self.run_replica(r))
        return True

    def _in_flight(self, r: Replica) -> int:
        return self.routes.in_flight(r.url) if r.url else 0

    def route(self, r: Replica) -> None:
        self.routes.add_upstream(r.url)
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
                    raise RuntimeError(f"exited while warming: {r.detail}")
                await asyncio.sleep(0.25)
            r.state, r.ready_at = READY, self.clock()
            self.failures = 0
            self.m.cold_start.labels(self.name).observe(r.ready_at - r.created)
            log.info("fleet: %s: %s ready at %s after %.1f s%s", self.name, r.id, r.url, r.ready_at - r.created,
                     " (warm pool)" if r.pooled else "")
            if not r.pooled:
                self.route(r)
            await self.provider.wait(r)
            if r.state == READY:
                raise RuntimeError(f"exited: {r.detail}")
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
            self.need = e.corrected
            self.placer.note_oom(self.name, e.placement)
        self.failures += 1
        delay = min(self.a.restart_backoff_s * 2 ** (self.failures - 1), MAX_BACKOFF_S)
        self.next_start_at = self.clock() + delay
        self.m.restarts.labels(self.name).inc()
        log.warning(json.dumps({"event": "replica_failed", "model": self.name, "replica": r.id, "url": r.url,
                                "detail": r.detail, "restart_in_s": round(delay, 2)}))
        self._forget(r)
        with contextlib.suppress(Exception):
            await self.provider.stop(r, 5.0)
        self.recent_failures.append(r.snapshot())
        self.poke()

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
        deadline = self.clock() + (self.a.drain_timeout_s if timeout is None else timeout)
        if was_ready:
            while self._in_flight(r) > 0 and self.clock() < deadline:
                r.detail = f"draining: {self._in_flight(r)} in flight"
                await asyncio.sleep(0.1)
        log.info(json.dumps({"event": "replica_drained", "model": self.name, "replica": r.id, "url": r.url,
                             "left_in_flight": self._in_flight(r)}))
        if r.task is not None and r.task is not asyncio.current_task():
            r.task.cancel()
        await self.provider.stop(r)
        r.state = STOPPED
        self._forget(r)

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
        if self.unplaceable and not self.replicas:
            raise unavailable(f"model {self.name!r} has no replica and none can be placed: {self.unplaceable}",
                              "unplaceable", retry_after=30.0)
        starting = any(r.state in (STARTING, WARMING) for r in self.replicas.values())
        if self.ready_routed() and not starting:
            return  # replicas exist but are ejected: the proxy answers (503) as before
        self.held += 1
        self.poke()
        deadline = self.clock() + self.a.cold_start_timeout_s
        try:
            while not self.routes.has_live_upstream():
                left = deadline - self.clock()
                if left <= 0:
                    raise unavailable(f"model {self.name!r}: no replica became ready within "
                                      f"{self.a.cold_start_timeout_s:g} s; retry later", "cold_start_timeout",
                                      retry_after=5.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.routed.wait(), min(left, 1.0))
        finally:
            self.held -= 1

    def status(self) -> dict:
        load = self.routes.admission_load()
        return {"model": self.name, "provider": self.cfg.provider, "desired": self.scaler.last.desired
                if self.scaler.last else None, "panic": bool(self.scaler.last and self.scaler.last.panic),
                "in_flight": load.in_flight, "queued": load.waiting, "held": self.held,
                "unplaceable": self.unplaceable, "need": {"gpus": self.need.gpus,
                "gib": None if self.need.gib == float("inf") else self.need.gib},
                "replicas": [r.snapshot(self._in_flight(r)) for r in self.replicas.values()],
                "recent_failures": list(self.recent_failures), "decisions": list(self.decisions)[-5:]}
