"""One sequence being generated: its tokens, how many are computed, and its KV blocks."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from argosy.engine.outputs import PromptLogprobs, SampleLogprobs
from argosy.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH,
                        SequenceStatus.FINISHED_ABORTED)


_seq_counter = itertools.count()


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    index: int = 0  # which of the request's n completions this is
    priority: int = 0  # lower runs first under the priority policy, as in vLLM
    cache_salt: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    seq_id: int = field(default_factory=lambda: next(_seq_counter))

    max_tokens: int = 0  # resolved by the engine from params.max_tokens and the context length

    # Filled in as it runs.
    token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of the full blocks
    status: SequenceStatus = SequenceStatus.WAITING
    stop_reason: int | str | None = None
    generator: torch.Generator | None = None
    logprobs: SampleLogprobs | None = None
    prompt_logprobs: PromptLogprobs | None = None  # filled as the prompt is computed (the first completion only)
    cumulative_logprob: float = 0.0
    num_preemptions: int = 0
    # Timestamps (time.monotonic) for metrics.
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    # Set by the engine: the incremental detokenizer holding this sequence's text.
    detokenizer: object | None = None
    # Set by the engine for structured outputs: an argosy.engine.structured.SequenceGrammar.
    grammar: Any = None

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        if self.params.logprobs is not None:
            self.logprobs = []
        if self.params.prompt_logprobs is not None and self.index == 0:
            self.prompt_logprobs = [None]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids):]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt logprobs are asked and not all computed: its prompt must be computed, not read from the cache."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids)

    @property
    def finished(self) -> bool:
        return self.status.finished

    @property
    def waiting_for_grammar(self) -> bool:
        """Its grammar is still compiling: the scheduler leaves it waiting and admits others."""
        return self.grammar is not None and not self.grammar.ready()

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
