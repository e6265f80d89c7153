"""Continuous batching under a token budget.

There are no prefill and decode phases: each step gives every running sequence its tokens to
compute (`num_tokens - num_computed_tokens`, capped by what is left of the budget), so a long
prompt is prefilled in chunks beside the decodes of everyone else. When the KV cache runs out,
the newest (or lowest-priority) running sequence is preempted and later recomputed.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from argosy.engine.kv_cache_manager import KVCacheManager
from argosy.engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, tokens to compute)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class WaitingQueue:
    """FCFS deque, or a heap ordered by (priority, arrival) under the priority policy."""

    def __init__(self, by_priority: bool):
        self.by_priority = by_priority
        self._fifo: deque[Sequence] = deque()
        self._heap: list[tuple[int, float, int, Sequence]] = []

    def push(self, seq: Sequence, front: bool = False) -> None:
        if self.by_priority:
            heapq.heappush(self._heap, (seq.priority, seq.arrival_time, seq.seq_id, seq))
        elif front:
            self._fifo.appendleft(seq)
        else:
            self._fifo.append(seq)

    def peek(self) -> Sequence:
        return self._heap[0][3] if self.by_priority else self._fifo[0]

    def pop(self) -> Sequence:
        return heapq.heappop(self._heap)[3] if self.by_priority else self._fifo.popleft()

    def remove(self, seq: Sequence) -> None:
        if self.by_priority:
            self._heap = [e for e in self._heap if e[3] is not seq]
            heapq.heapify(self._heap)
        else:
            self._fifo.remove(seq)

    def __len__(self) -> int:
        return len(self._heap) if self.by_priority else len(self._fifo)

    def __iter__(self):
        return (e[3] for e in self._heap) if self.by_priority else iter(self._fifo)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, token_budget: int, policy: str = "fcfs"):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.token_budget = token_budget
        self.by_priority = policy == "priority"
        self.waiting = WaitingQueue(self.by_priority)
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.push(seq)

    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def schedule(self, in_flight: Collection[Sequence] = ()) -> SchedulerOutput:
        """One batch under the token budget. in_flight: sequences whose batch is still running (pipeline
        micro-batches); they are neither scheduled again (their next token depends on that batch) nor
        preempted (their blocks are being read and written)."""
        out = SchedulerOutput()
        budget = self.token_budget
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if in_flight and seq in in_flight:
                i += 1
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.kv.allocate_slots(seq, n):
                victim = self._pick_victim(in_flight)
                if self.running.index(victim) < i:  # already scheduled this step: give back its tokens
                    i -= 1
                    budget += next(m for s, m in out.scheduled if s is victim)
                self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # it preempted itself; running[i] is now the next sequence
            out.scheduled.append((seq, n))
            budget -= n
            i += 1
        if out.preempted:
            return out  # memory is tight: admit nobody new this step
        compiling: list[Sequence] = []  # waiting for their grammar: skipped, not blocking the queue
        while budget > 0 and len(self.waiting) and len(self.running) < self.max_num_seqs:
            seq = self.waiting.peek()
            if seq.waiting_for_grammar:
                compiling.append(self.waiting.pop())
                continue
            computed_blocks, num_cached = [], 0
            if seq.num_computed_tokens == 0 and not seq.wants_prompt_logprobs:  # (cached tokens have no logits)
                computed_blocks, num_cached = self.kv.get_computed_blocks(seq)
            n = min(seq.num_tokens - num_cached, budget)
            if not self.kv.allocate_slots(seq, n, computed_blocks):
                break  # first come, first served: nobody jumps the queue for lack of blocks
            self.waiting.pop()
            seq.num_computed_tokens = num_cached
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = num_cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n
        for seq in reversed(compiling):  # back at the head, in their order
            self.waiting.push(seq, front=True)
        return out

    def _pick_victim(self, in_flight: Collection[Sequence] = ()) -> Sequence:
        # Never empty: the sequence asking for blocks is not in flight itself.
        candidates = [s for s in self.running if s not in in_flight] if in_flight else self.running
        if self.by_priority:
            return max(candidates, key=lambda s: (s.priority, s.arrival_time))
        return candidates[-1]

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        # Preemption by recompute: drop the blocks; the tokens (prompt and output so far) stay, and
        # the prefix cache usually gives most of them back when it is readmitted.
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.push(seq, front=True)
        out.preempted.append(seq)
        out.scheduled = [(s, n) for s, n in out.scheduled if s is not seq]

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """Ends a sequence (stopped, length, aborted) wherever it is, freeing its blocks at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.kv.free(seq)
        seq.status = status
