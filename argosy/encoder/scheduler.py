"""The encoder's scheduler: waiting inputs, first come first served, cut into batches by a token budget.

An encoder request is one pass per input, with no decode phase: a batch is as many whole inputs as fit
in `max_num_batched_tokens` and `max_num_seqs`, in arrival order (an input longer than the budget runs
alone). A request's own inputs are queued longest first, so a large request makes batches of similar
lengths; the batch is packed longest first either way (batch.py), so mixed lengths cost no padding in
the linear layers.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch


@dataclass(eq=False)
class EncodeRequest:
    request_id: str
    num_inputs: int
    num_tokens: int  # all inputs together (usage)
    arrival: float = field(default_factory=time.monotonic)
    results: list[torch.Tensor | None] = field(default_factory=list)
    remaining: int = 0
    first_scheduled: float | None = None

    def __post_init__(self) -> None:
        self.results = [None] * self.num_inputs
        self.remaining = self.num_inputs


@dataclass(eq=False)
class EncodeItem:
    request: EncodeRequest
    index: int  # position in the request's inputs
    ids: list[int]
    type_ids: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.ids)


class EncoderScheduler:
    def __init__(self, max_num_batched_tokens: int, max_num_seqs: int):
        self.max_tokens, self.max_seqs = max_num_batched_tokens, max_num_seqs
        self.waiting: deque[EncodeItem] = deque()
        self.running: list[EncodeItem] = []  # the batch handed out last
        self.queued_tokens = 0
        self.requests: dict[str, EncodeRequest] = {}  # unfinished, by id

    def add(self, request: EncodeRequest, items: list[EncodeItem]) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already queued")
        self.requests[request.request_id] = request
        self.waiting.extend(sorted(items, key=lambda it: -it.num_tokens))
        self.queued_tokens += sum(it.num_tokens for it in items)

    def schedule(self) -> list[EncodeItem]:
        batch: list[EncodeItem] = []
        tokens = 0
        while self.waiting and len(batch) < self.max_seqs:
            n = self.waiting[0].num_tokens
            if batch and tokens + n > self.max_tokens:
                break
            item = self.waiting.popleft()
            batch.append(item)
            tokens += n
        self.queued_tokens -= tokens
        self.running = batch
        now = time.monotonic()
        for item in batch:
            if item.request.first_scheduled is None:
                item.request.first_scheduled = now
        return batch

    def finish(self, request: EncodeRequest) -> None:
        self.requests.pop(request.request_id, None)

    def abort(self, request_id: str) -> bool:
        """Drops the request's waiting inputs; False if it is not here (finished, or never added)."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        kept = deque(it for it in self.waiting if it.request is not request)
        self.queued_tokens -= sum(it.num_tokens for it in self.waiting if it.request is request)
        self.waiting = kept
        return True
