"""One simulated encoder replica (a model of kind embed or rerank): the encoder engine's real scheduler.

A request is one pass over its input tokens, no decode: a step is a batch of whole inputs, first come
first served under the token budget, as EncoderScheduler cuts it in the engine; its duration is the
profile's prefill step for those tokens (`argosy profile --model ENCODER` measures it). A request's first
token and its end are the end of its batch. It offers what FleetSim reads of an LLM replica.
"""

from __future__ import annotations

from collections.abc import Callable

from argosy.encoder.scheduler import EncodeItem, EncodeRequest, EncoderScheduler
from argosy.sim.profile import StepProfile
from argosy.sim.replica import SimRequest


class _NoKV:
    usage = 0.0  # an encoder holds no KV cache


class EncoderSimReplica:
    def __init__(self, name: str, region: int, profile: StepProfile, max_num_seqs: int, token_budget: int,
                 started_s: float, ready_s: float, prefix_tokens: dict[int, list[int]]):
        self.name, self.region, self.profile = name, region, profile
        self.kv = _NoKV()
        self.sched = EncoderScheduler(token_budget, max_num_seqs)
        self.started_s, self.ready_s, self.stopped_s = started_s, ready_s, None
        self.prefix_tokens = prefix_tokens
        self.draining = False
        self.version = 0
        self.busy = False
        self.run_start = 0.0
        self.run_ends: list[float] = []
        self.batch: list[EncodeItem] = []
        self.requests: dict[str, SimRequest] = {}
        self.busy_s = self.prefill_s = 0.0
        self.engine_cpu_s = self.outside_cpu_s = 0.0  # on a shared node (as SimReplica's)
        self.itl: list[tuple[float, int]] = []  # none: nothing is decoded
        # A batch's seconds on a shared node, given its seconds and node CPU seconds (SharedNode.stretch).
        self.stretch: Callable[[list[float], float], list[float]] | None = None

    def now_starting(self, now: float) -> bool:
        return now < self.ready_s

    @property
    def num_in_system(self) -> int:
        return len(self.requests)

    def add(self, req: SimRequest, now: float) -> None:
        n = req.prompt_tokens + len(self.prefix_tokens.get(req.prefix_group, ()))
        r = EncodeRequest(str(req.rid), 1, n, arrival=now)
        self.requests[r.request_id] = req
        self.sched.add(r, [EncodeItem(r, 0, range(n))])  # only the length is read

    def start_step(self, now: float) -> float | None:
        self.batch = self.sched.schedule()
        if not self.batch:
            self.busy = False
            return None
        lengths = [it.num_tokens for it in self.batch]
        # Bidirectional attention: every token sees its whole input (the LLM's causal prefill counts half).
        dt = self.profile.step_s(sum(lengths), 0, sum(lengths), sum(n * n for n in lengths))
        if self.stretch is not None:  # replicas sharing a CPU node's cores
            requests = len({it.request.request_id for it in self.batch})
            outside = self.profile.node_cpu_s(0, 0, requests)
            self.engine_cpu_s += dt
            self.outside_cpu_s += outside
            dt = self.stretch([dt], outside)[0]
        self.busy, self.run_start, self.run_ends = True, now, [now + dt]
        self.version += 1
        return now + dt

    def cut_run(self, now: float) -> float | None:
        return None  # a batch is one step: nothing to cut

    def finish_step(self, now: float) -> list[SimRequest]:
        self.busy_s += now - self.run_start
        self.prefill_s += now - self.run_start
        done = []
        for item in self.batch:
            req = self.requests.pop(item.request.request_id, None)
            if req is None:
                continue  # failed meanwhile
            self.sched.finish(item.request)
            req.first_token_s = req.finish_s = now
            done.append(req)
        self.batch, self.busy = [], False
        return done

    def fail(self) -> list[SimRequest]:
        reqs = list(self.requests.values())
        for rid in list(self.requests):
            self.sched.abort(rid)
        self.requests.clear()
        self.batch, self.busy = [], False
        self.version += 1
        return reqs

    def release(self) -> None:
        pass
