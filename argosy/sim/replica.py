"""One simulated replica: the engine's real Scheduler and KVCacheManager on Sequences of fake token ids.

A step is what LLMEngine.step does, minus the model: schedule, advance num_computed_tokens, append a
token to each sequence that computed its last one, finish those at max_tokens. Its duration comes from
the profile. For speed, a step whose batch is all decodes starts a *run* of K decode steps in one event:
in such a run nothing can change the batch until a sequence finishes (K is capped there), a new
request arrives (the run is cut after the step in progress), or the KV cache runs short (K is capped so
that every block the run needs is free now). A waiting sequence that could not be admitted stays
unadmittable through the run: the budget, the sequence cap and the free blocks only shrink.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

from argosy.engine.block_pool import hash_block_tokens
from argosy.engine.kv_cache_manager import KVCacheManager
from argosy.engine.sampling_params import SamplingParams
from argosy.engine.scheduler import Scheduler
from argosy.engine.sequence import Sequence, SequenceStatus
from argosy.sim.profile import StepProfile

MAX_RUN_STEPS = 512
_PARAMS = SamplingParams(max_tokens=1, ignore_eos=True)  # one shared object: the sim reads seq.max_tokens
_FINISHED = SequenceStatus.FINISHED_LENGTH
# KV managers of stopped replicas, by (num_blocks, block_size): building a pool of ~30k blocks costs
# tens of ms, and a week plan starts thousands of replicas. A reused one is emptied first.
_SPARE_KV: dict[tuple[int, int], list[KVCacheManager]] = {}


def _kv_manager(num_blocks: int, block_size: int) -> KVCacheManager:
    spare = _SPARE_KV.get((num_blocks, block_size))
    if spare:
        return spare.pop()
    return KVCacheManager(num_blocks, block_size, enable_prefix_caching=True)


@dataclass(eq=False)
class SimRequest:
    rid: int
    arrival_s: float
    region: int
    prompt_tokens: int  # unique part (after the shared prefix)
    output_tokens: int
    prefix_group: int
    extra_latency_s: float = 0.0  # cross-region round trip when served away from home
    overhead_factor: float = 1.0  # its serving overhead (profile.request_s) runs this many times slower
    replica: str = ""  # where it was (last) sent
    first_token_s: float | None = None
    finish_s: float | None = None
    failed: bool = False
    cached_tokens: int = 0
    preemptions: int = 0
    seq: Sequence | None = None
    block_hashes: list[int] = field(default_factory=list)  # given to its Sequence (see SimReplica.add)


class SimReplica:
    def __init__(self, name: str, region: int, profile: StepProfile, max_num_seqs: int, token_budget: int,
                 started_s: float, ready_s: float, prefix_tokens: dict[int, list[int]]):
        self.name, self.region, self.profile = name, region, profile
        self.kv = _kv_manager(profile.num_blocks, profile.block_size)
        self.sched = Scheduler(self.kv, max_num_seqs, token_budget)
        self.started_s, self.ready_s, self.stopped_s = started_s, ready_s, None
        self.prefix_tokens = prefix_tokens
        self.prefix_hashes: dict[int, list[int]] = {}
        self.draining = False
        self.version = 0  # bumps when the pending step event is replaced
        self.busy = False
        self.run_start = 0.0
        self.run_ends: list[float] = []  # cumulative end times of the run's steps
        self.run_seqs: list[tuple[Sequence, int]] = []
        self.requests: dict[int, SimRequest] = {}  # seq_id -> request
        self.busy_s = self.prefill_s = 0.0
        # On a shared node: CPU seconds of the steps done, in the engine (as profiled, with the neighbour
        # term) and outside it (node_cpu_s), before any stretching; a cut run counts the steps it ran.
        self.engine_cpu_s = self.outside_cpu_s = 0.0
        self.run_cpu: list[tuple[float, float]] = []  # (engine, outside) seconds of each step of the run
        # Replicas sharing a node's cores: given a run's steps' profiled seconds and the node CPU seconds
        # their tokens cost outside the engine, their seconds on the node, read when it starts
        # (SharedNode.stretch).
        self.stretch: Callable[[list[float], float], list[float]] | None = None
        self.neighbour_s: Callable[[], float] | None = None  # its step's extra beside busy neighbours
        self.outside_scale: Callable[[], float] | None = None  # its node CPU's multiplier beside them
        self.itl: list[tuple[float, int]] = []  # (inter-token gap, tokens with that gap)

    def now_starting(self, now: float) -> bool:
        return now < self.ready_s

    @property
    def num_in_system(self) -> int:
        return len(self.requests)

    def add(self, req: SimRequest, now: float) -> None:
        shared = self.prefix_tokens.get(req.prefix_group, ())
        prompt = list(shared)
        prompt.append(-1 - req.rid)  # a unique token: no accidental prefix sharing after the shared part
        prompt.extend([0] * (req.prompt_tokens - 1))
        seq = Sequence(str(req.rid), prompt, _PARAMS, arrival_time=now)
        seq.max_tokens = req.output_tokens
        # The block hashes the KV manager would compute, given up front (it hashes only blocks past the
        # ones a sequence carries; hashing was a fifth of a simulation's time). The shared prefix's full
        # blocks get their real chained hashes, computed once; every later block holds this request's
        # unique token, so any value no other block has will do: a tagged (request, block) pair.
        hashes = list(self._prefix_hashes(req.prefix_group, shared)) if shared else []
        tag = (1 << 127) | (req.rid << 24)
        hashes.extend(tag | i for i in range(len(hashes), (len(prompt) + req.output_tokens) // self.profile.block_size))
        req.block_hashes = hashes
        seq.block_hashes = list(hashes)
        req.seq = seq
        self.requests[seq.seq_id] = req
        self.sched.add(seq)

    def _prefix_hashes(self, group: int, tokens) -> list[int]:
        hashes = self.prefix_hashes.get(group)
        if hashes is None:
            bs, hashes = self.profile.block_size, []
            for i in range(len(tokens) // bs):
                hashes.append(hash_block_tokens(hashes[-1] if hashes else None, tokens[i * bs:(i + 1) * bs]))
            self.prefix_hashes[group] = hashes
        return hashes

    def start_step(self, now: float) -> float | None:
        """Schedules the next step (or run of decode steps); returns when it ends, or None when idle."""
        out = self.sched.schedule()
        if not out.scheduled:
            self.busy = False
            return None
        for seq in out.preempted:
            req = self.requests[seq.seq_id]
            req.preemptions += 1
            seq.block_hashes = list(req.block_hashes)  # freeing dropped them; readmission looks them up
        prof = self.profile
        prefill = decodes = kv = attn = completed = first = 0
        all_decode = True
        for seq, n in out.scheduled:
            kv += seq.num_computed_tokens + n
            if n == 1 and seq.num_computed_tokens + 1 == seq.num_tokens and seq.num_output_tokens > 0:
                decodes += 1
            else:
                prefill += n
                attn += n * (seq.num_computed_tokens + (n + 1) // 2)  # causal: the mean context
                all_decode = False
                if seq.num_computed_tokens + n == seq.num_tokens:  # the chunk ends the prompt: a token
                    completed += 1
                    first += seq.num_output_tokens == 0
        steps = 1
        if all_decode:
            steps = min(MAX_RUN_STEPS, min(s.max_tokens - s.num_output_tokens for s, _ in out.scheduled))
            if steps > 1:
                # Blocks the whole run needs, counted inline (num_blocks_needed per sequence is slower).
                bs, short = self.kv.block_size, []
                for s, _ in out.scheduled:
                    if -(-(s.num_computed_tokens + steps) // bs) > len(s.block_ids):
                        short.append(s)
                if short:
                    if sum(self.kv.num_blocks_needed(s, steps) for s in short) > self.kv.num_free_blocks:
                        steps = 1
                    else:
                        for s in short:
                            self.kv.allocate_slots(s, steps)
            times = prof.decode_run_s(decodes, kv, steps)
        else:
            times = [prof.step_s(prefill, decodes, kv, attn)]
        if self.stretch is not None:  # replicas sharing a CPU node's cores (FleetSim, --node-cores)
            if self.neighbour_s is not None:
                extra = self.neighbour_s()
                times = [t + extra for t in times]
            batch = decodes + completed
            outside = prof.node_cpu_s(batch, batch * len(times), first)
            if self.outside_scale is not None:
                outside *= self.outside_scale()
            self.run_cpu = [(t, outside / len(times)) for t in times]
            times = self.stretch(times, outside)
        if prefill:
            self.prefill_s += times[0] * prefill / (prefill + decodes)
        t, ends = now, []
        for dt in times:
            t += dt
            ends.append(t)
        self.busy, self.run_start, self.run_ends, self.run_seqs = True, now, ends, out.scheduled
        self.version += 1
        return ends[-1]

    def cut_run(self, now: float) -> float | None:
        """A request arrived mid-run: the run ends with the step in progress. Returns its new end, if earlier."""
        if not self.busy or len(self.run_ends) == 1:
            return None
        k = bisect_left(self.run_ends, now) + 1  # steps ended by now, plus the one in progress
        if k >= len(self.run_ends):
            return None
        del self.run_ends[k:]
        self.version += 1
        return self.run_ends[-1]

    def finish_step(self, now: float) -> list[SimRequest]:
        """Applies the run's steps (as LLMEngine.step does after the forward pass); returns finished requests."""
        steps = len(self.run_ends)
        self.busy_s += now - self.run_start
        for engine, outside in self.run_cpu[:steps]:
            self.engine_cpu_s += engine
            self.outside_cpu_s += outside
        self.run_cpu = []
        if steps > 1:
            gap = (now - self.run_start) / steps
            self.itl.append((gap, steps * len(self.run_seqs)))
        done = []
        for seq, n in self.run_seqs:
            if seq.status is not SequenceStatus.RUNNING:
                continue  # finished or failed meanwhile
            if steps > 1:
                seq.num_computed_tokens += steps
                seq.token_ids.extend([0] * steps)
            else:
                seq.num_computed_tokens += n
                if seq.num_computed_tokens < seq.num_tokens:
                    continue  # a prefill chunk: no token yet
                if seq.num_output_tokens > 0:
                    self.itl.append((now - seq.last_token_time, 1))
                seq.append_token(0)
            seq.last_token_time = now
            req = self.requests[seq.seq_id]
            if req.first_token_s is None:
                req.first_token_s = now
                req.cached_tokens = seq.num_cached_tokens
            if seq.num_output_tokens >= seq.max_tokens:
                self.sched.finish(seq, _FINISHED)
                req.finish_s = now
                req.seq, req.block_hashes = None, []  # its tokens and hashes: most of a long run's memory
                del self.requests[seq.seq_id]
                done.append(req)
        self.busy = False
        return done

    def fail(self) -> list[SimRequest]:
        """The replica is gone: every request on it is dropped (the caller retries or fails them)."""
        reqs = list(self.requests.values())
        for req in reqs:
            if not req.seq.finished:
                self.sched.finish(req.seq, SequenceStatus.FINISHED_ABORTED)
        self.requests.clear()
        self.busy = False
        self.version += 1
        return reqs

    def release(self) -> None:
        """The replica is stopped and holds no request: its KV manager goes back for reuse, emptied."""
        kv = self.kv
        if kv.num_free_blocks == kv.num_blocks and len(_SPARE_KV.get((kv.num_blocks, kv.block_size), ())) < 256:
            kv.reset_prefix_cache()
            kv.queries = kv.hits = 0
            _SPARE_KV.setdefault((kv.num_blocks, kv.block_size), []).append(kv)
