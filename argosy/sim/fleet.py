"""The discrete-event simulation of one model's fleet across regions.

Each region runs the gateway's real Router (with its prefix index) over simulated replicas, and the
fleet's real Autoscaler (unless the replica count is fixed). A region that fails loses its replicas;
its traffic goes to the live regions with `failover_rtt_s` added. With a fleet file that has `regions`
(sim/regions.py), the gateways' own region routing decides instead: home below its saturation threshold,
else spill or fail over to the best other region, with that pair's round trip added, and back through
the hold-down and ramp. A replica failure with `notice_s` is a spot preemption: it drains, a
replacement starts at once, and what has not finished by the deadline fails. A request on a failed replica is
retried elsewhere if it has no token yet (the gateway retries before the first byte), else it fails.
Time is simulated: the router's prefix index and the autoscaler read the simulation's clock. Replica
gauges are refreshed each tick only when the real system would scrape them: the router's scorers read
them (Router.needs_gauges) or the autoscaler's metric does (ScalingMetric.needs_scrape).
"""

from __future__ import annotations

import functools
import heapq
import itertools

from argosy.config import FleetConfig, ModelConfig
from argosy.encoder.config import CPU_BATCH_TOKENS, CUDA_BATCH_TOKENS
from argosy.engine.config import default_token_budget
from argosy.fleet.autoscaler import Autoscaler, Observation
from argosy.fleet.scaling_metrics import METRICS
from argosy.gateway.health import Upstream
from argosy.gateway.router import RouteRequest
from argosy.sim.encoder_replica import EncoderSimReplica
from argosy.sim.fleet_region import Region
from argosy.sim.profile import StepProfile
from argosy.sim.regions import SimRegions
from argosy.sim.replica import SimReplica, SimRequest
from argosy.sim.settings import SimSettings
from argosy.sim.shared_node import SharedNode
from argosy.sim.traffic import Requests, TrafficSpec

STEP, READY, TICK, FAIL, RECOVER, SAMPLE, DEADLINE = range(7)


class FleetSim:
    def __init__(self, model: ModelConfig, profile: StepProfile, spec: TrafficSpec, requests: Requests,
                 settings: SimSettings = SimSettings(), fleet: FleetConfig | None = None):
        self.model, self.profile, self.spec, self.reqs, self.s = model, profile, spec, requests, settings
        self.now = 0.0
        self.events: list = []
        self.counter = itertools.count()
        self.regions = [Region(i, r.name, model, lambda: self.now) for i, r in enumerate(spec.regions)]
        self.all_replicas: list[SimReplica] = []
        self.done: list[SimRequest] = []
        self.failed: list[SimRequest] = []
        self.timeline: list[dict] = []
        self.decisions: list[dict] = []
        self.rr = 0
        self.preemptions = 0  # spot replicas preempted with notice (drained and replaced)
        self.gave_up_s: float | None = None  # when run(give_up=...) stopped it early
        sp = spec.shared_prefix
        self.prefix_tokens = {g: [10_000_000 + g] * sp.tokens for g in range(sp.groups)} if sp else {}
        self.prefix_text = {g: (f"[shared prefix {g}] " * sp.tokens)[:4 * sp.tokens] for g in range(sp.groups)} \
            if sp else {}
        self.uses_text = any(r.router.needs_prompt for r in self.regions)  # else prompts are not built
        self.scrapes = (any(r.router.needs_gauges for r in self.regions)  # as the gateway or the controller
                        or METRICS[model.autoscaling.metric].needs_scrape)
        # An encoder (kind embed or rerank) answers with one pass over the input: no output tokens.
        self.generates = model.kind == "generate"
        self.replica_class = SimReplica if self.generates else EncoderSimReplica
        self.ids = itertools.count()
        self.by_name: dict[str, SimReplica] = {}
        self.region_routing = SimRegions(fleet, model, spec, lambda: self.now, spec.seed) \
            if fleet is not None and fleet.regions else None
        self.node = None if settings.node_cores is None else SharedNode(
            settings.node_cores, settings.replica_threads, profile,
            lambda: (r for region in self.regions for r in region.replicas))

    def fixed_replicas(self, region: str) -> int:
        return dict(self.s.replicas_by_region).get(region, self.s.replicas or 0)

    # ------------------------------------------------------------------ events

    def push(self, t: float, kind: int, obj=None, version: int = 0) -> None:
        heapq.heappush(self.events, (t, next(self.counter), kind, obj, version))

    def start_replica(self, region: Region, now: float, cold: bool = True) -> SimReplica:
        e = self.model.engine
        cold = cold and now >= self.s.instant_start_until_s
        ready = now + (self.profile.cold_start_s if cold else 0.0)
        # Unset in the fleet file: the budget the engine picks for a server on this profile's device.
        on_cpu = self.profile.gpu == "cpu"
        if self.generates:
            budget = e.max_num_batched_tokens or default_token_budget("cpu" if on_cpu else "cuda")
        else:
            budget = e.max_num_batched_tokens or (CPU_BATCH_TOKENS if on_cpu else CUDA_BATCH_TOKENS)
        rep = self.replica_class(f"{region.name}-{next(self.ids)}", region.idx, self.profile, e.max_num_seqs,
                                 budget, now, ready, self.prefix_tokens)
        if self.node is not None:
            rep.stretch = functools.partial(self.node.stretch, rep)
            if self.generates:
                rep.neighbour_s = functools.partial(self.node.neighbour_s, rep)
                rep.outside_scale = functools.partial(self.node.outside_scale, rep)
        region.replicas.append(rep)
        self.all_replicas.append(rep)
        self.by_name[rep.name] = rep
        if cold and self.node is not None:  # its start shares the node's cores: paced by SharedNode
            self.node.start(rep, now)
            self.pace_starts()
        elif cold:
            self.push(ready, READY, rep)
        else:
            self.make_ready(rep)
        return rep

    def pace_starts(self) -> None:
        for ready, rep, version in self.node.pace(self.now):
            self.push(ready, READY, rep, version)

    def make_ready(self, rep: SimReplica) -> None:
        region = self.regions[rep.region]
        if rep.stopped_s is not None or region.down:
            return
        region.upstreams[rep.name] = Upstream(rep.name)
        region.router.set_upstreams(list(region.upstreams.values()))
        held, region.pending = region.pending, []
        for req in held:
            self.route(req, region)

    def stop_replica(self, rep: SimReplica) -> None:
        region = self.regions[rep.region]
        rep.stopped_s = self.now
        region.replicas.remove(rep)
        if self.node is not None:
            self.node.forget(rep)
        if region.upstreams.pop(rep.name, None) is not None:
            region.router.set_upstreams(list(region.upstreams.values()))
        if not rep.requests:
            rep.release()

    # ------------------------------------------------------------------ requests

    def arrive(self, req: SimRequest) -> None:
        if self.region_routing is not None:
            return self.arrive_routed(req)
        region = self.regions[req.region]
        if region.down:
            live = [r for r in self.regions if not r.down]
            if not live:
                req.failed = True
                self.failed.append(req)
                return
            self.rr += 1
            region = live[self.rr % len(live)]
            req.extra_latency_s = self.spec.failover_rtt_s
        self.route(req, region)

    def arrive_routed(self, req: SimRequest) -> None:
        """The gateways' region routing (sim/regions.py) picks the serving region."""
        rr = self.region_routing
        for r in self.regions:
            routable = r.routable()
            in_flight = sum(x.num_in_system for x in routable) + len(r.pending)
            rr.update(r.idx, not r.down and bool(routable), in_flight, len(routable))
        j = rr.choose(req.region)
        if j is None:
            req.failed = True
            self.failed.append(req)
            return
        req.extra_latency_s = self.spec.rtt(self.regions[req.region].name, self.regions[j].name)
        self.route(req, self.regions[j])

    def route_tokens(self, req: SimRequest) -> int:
        return req.prompt_tokens + len(self.prefix_tokens.get(req.prefix_group, ()))

    def route(self, req: SimRequest, region: Region) -> None:
        text = ""
        if self.uses_text:
            text = self.prefix_text.get(req.prefix_group, "") + f"#{req.rid}".ljust(64)
        tokens = self.route_tokens(req)
        up = region.router.choose(RouteRequest(text, tokens))
        if up is None:
            region.pending.append(req)
            return
        up.on_start(tokens)
        rep = self.by_name[up.url]
        req.replica = rep.name
        if self.node is not None:
            req.overhead_factor = self.node.overhead_factor()
        rep.add(req, self.now)
        if rep.busy:
            end = rep.cut_run(self.now)
            if end is not None:
                self.push(end, STEP, rep, rep.version)
        else:
            end = rep.start_step(self.now)
            if end is not None:
                self.push(end, STEP, rep, rep.version)

    def on_step(self, rep: SimReplica) -> None:
        region = self.regions[rep.region]
        for req in rep.finish_step(self.now):
            up = region.upstreams.get(rep.name)
            if up is not None:
                up.on_end(self.route_tokens(req))
            region.finished_since_tick += 1
            self.done.append(req)
        end = rep.start_step(self.now)
        if end is not None:
            self.push(end, STEP, rep, rep.version)
        elif rep.draining and not rep.requests:
            self.stop_replica(rep)

    # ------------------------------------------------------------------ scaling and failures

    def on_tick(self, region: Region) -> None:
        if region.down:
            return
        ready = region.routable()
        starting = [r for r in region.replicas if r.name not in region.upstreams and not r.draining]
        waiting = sum(len(r.sched.waiting) for r in ready) + len(region.pending)
        for r in ready if self.scrapes else ():  # what the gateway or the controller scrapes
            up = region.upstreams[r.name]
            up.waiting, up.kv_usage = float(len(r.sched.waiting)), r.kv.usage
        if region.scaler is None:
            return
        tick = self.model.autoscaling.tick_s
        obs = Observation(concurrency=float(sum(r.num_in_system for r in ready) + len(region.pending)),
                          rps=region.finished_since_tick / tick, queue=float(waiting),
                          kv_cache=sum(r.kv.usage for r in ready) / len(ready) if ready else 0.0,
                          tokens=float(sum(self.route_tokens(q) for r in ready for q in r.requests.values())
                                       + sum(self.route_tokens(q) for q in region.pending)))
        region.finished_since_tick = 0
        region.scaler.observe(obs, len(ready))
        d = region.scaler.decide(len(ready), len(ready) + len(starting))
        if d.direction != "hold":
            self.decisions.append({"t": round(self.now, 3), "region": region.name, "desired": d.desired,
                                   "ready": d.ready, "kind": d.kind, "reason": d.reason})
        for _ in range(d.desired - len(ready) - len(starting)):
            self.start_replica(region, self.now)
        excess = len(ready) + len(starting) - d.desired
        for rep in sorted(starting, key=lambda r: -r.started_s)[:max(excess, 0)]:
            self.stop_replica(rep)  # a replica still starting is cancelled first
            excess -= 1
        for rep in sorted(ready, key=lambda r: -r.started_s)[:max(excess, 0)]:
            rep.draining = True  # out of the routing set; stops once its requests are done
            region.upstreams.pop(rep.name)
            region.router.set_upstreams(list(region.upstreams.values()))
            if not rep.requests:
                self.stop_replica(rep)

    def lose(self, rep: SimReplica) -> None:
        """A replica dies: requests without a token yet are retried, the others fail."""
        region = self.regions[rep.region]
        reqs = rep.fail()
        self.stop_replica(rep)
        for req in reqs:
            up = region.upstreams.get(rep.name)
            if up is not None:
                up.on_end(self.route_tokens(req))
            if req.first_token_s is None:
                self.arrive(req)
            else:
                req.failed = True
                self.failed.append(req)

    def on_fail(self, f) -> None:
        region = next(r for r in self.regions if r.name == f.region)
        if f.replica is None:
            region.down = True
            for rep in list(region.replicas):
                self.lose(rep)
            held, region.pending = region.pending, []
            for req in held:
                self.arrive(req)
        else:
            reps = sorted(region.routable(), key=lambda r: r.started_s)
            if f.replica < len(reps) and f.notice_s is not None:
                self.preempt(reps[f.replica], f.notice_s)
                return  # replaced at once: nothing to recover
            if f.replica < len(reps):
                self.lose(reps[f.replica])
        self.push(self.now + f.duration_s, RECOVER, f)

    def preempt(self, rep: SimReplica, notice_s: float) -> None:
        """A spot preemption with notice: it drains and its replacement starts now (a cold start)."""
        region = self.regions[rep.region]
        rep.draining = True
        region.upstreams.pop(rep.name, None)
        region.router.set_upstreams(list(region.upstreams.values()))
        self.preemptions += 1
        if not rep.requests:
            self.stop_replica(rep)
        else:
            self.push(self.now + notice_s, DEADLINE, rep)
        self.start_replica(region, self.now)

    def on_recover(self, f) -> None:
        region = next(r for r in self.regions if r.name == f.region)
        if f.replica is None:
            region.down = False
            want = (self.fixed_replicas(region.name) if self.s.replicas is not None
                    else max(self.model.autoscaling.min_replicas, 1))
            for _ in range(want):
                self.start_replica(region, self.now)
        elif region.scaler is None:
            self.start_replica(region, self.now)  # fixed fleets restart it; the autoscaler replaces it itself

    def sample(self) -> None:
        row = {"t": round(self.now, 3), "replicas": {}, "queue": 0, "running": 0}
        for region in self.regions:
            ready = region.routable()
            row["replicas"][region.name] = len(ready)
            row["queue"] += sum(len(r.sched.waiting) for r in ready) + len(region.pending)
            row["running"] += sum(len(r.sched.running) for r in ready)
        row["starting"] = sum(1 for r in self.all_replicas if r.stopped_s is None and r.now_starting(self.now))
        # Cumulative busy and prefill seconds of every replica: a window's GPU busy share and input/output
        # time split are differences of two rows (results.steady_window).
        row["busy_s"] = round(sum(r.busy_s for r in self.all_replicas), 6)
        row["prefill_s"] = round(sum(r.prefill_s for r in self.all_replicas), 6)
        self.timeline.append(row)

    # ------------------------------------------------------------------ the loop

    def run(self, progress=None, give_up=None) -> None:
        """Simulate to the end of the traffic and its drain; `give_up(sim)`, asked after each timeline
        sample, can stop it early (gave_up_s then says when): the caller already knows the answer."""
        a = self.model.autoscaling
        for region in self.regions:
            if self.s.replicas is None:
                region.scaler = Autoscaler(a, lambda: self.now)
                n = dict(self.s.initial_replicas).get(region.name, max(a.min_replicas, 1))
            else:
                n = self.fixed_replicas(region.name)
            for _ in range(n):
                self.start_replica(region, 0.0, cold=False)  # the fleet is up when the run starts
            self.push(a.tick_s, TICK, region)
        for f in self.spec.failures:
            self.push(f.at_s, FAIL, f)
        self.push(0.0, SAMPLE)
        duration, rq = self.spec.duration_s, self.reqs
        n, i = len(rq), 0
        end_by = duration + self.s.drain_limit_s
        events = self.events
        while True:
            t_next = events[0][0] if events else float("inf")
            if i < n and rq.arrival_s[i] <= t_next:
                self.now = rq.arrival_s[i]
                self.arrive(SimRequest(i, rq.arrival_s[i], rq.region[i], rq.prompt_tokens[i],
                                       rq.output_tokens[i] if self.generates else 0, rq.prefix_group[i]))
                i += 1
                if progress is not None and i % 5000 == 0:
                    progress(self.now, i, n)
                continue
            if not events or t_next > end_by:
                break
            t, _, kind, obj, version = heapq.heappop(events)
            self.now = t
            if kind == STEP:
                if version == obj.version and obj.stopped_s is None:
                    self.on_step(obj)
            elif kind == READY:
                if self.node is None or self.node.started(obj, version):  # else re-paced since
                    self.make_ready(obj)
            elif kind in (TICK, SAMPLE):
                if t > duration and not any(r.requests for r in self.all_replicas if r.stopped_s is None):
                    continue  # arrivals are over and everything finished: let the loop end
                if kind == TICK:
                    if self.node is not None:
                        self.pace_starts()
                    self.on_tick(obj)
                    self.push(t + a.tick_s, TICK, obj)
                else:
                    self.sample()
                    self.push(t + self.s.sample_s, SAMPLE)
                    if give_up is not None and give_up(self):
                        self.gave_up_s = t
                        break
            elif kind == FAIL:
                self.on_fail(obj)
            elif kind == RECOVER:
                self.on_recover(obj)
            elif kind == DEADLINE:
                if obj.stopped_s is None and obj.requests:
                    self.lose(obj)  # the notice ran out before its requests finished
        for region in self.regions:  # what never got a replica (e.g. every region down) failed
            for req in region.pending:
                req.failed = True
                self.failed.append(req)
            region.pending = []
        for rep in self.all_replicas:
            if rep.stopped_s is None and not rep.requests:
                rep.release()
