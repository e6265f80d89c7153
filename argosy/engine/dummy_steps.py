"""Steps over made-up sequences, run once at start on CUDA to measure memory (memory_profile.py): the
largest step the scheduler can form, and the largest decode step a CUDA graph will replay. Each attends
over a small KV cache of its own, which it frees before returning (and reports, so that the profile does
not count it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from argosy.engine.memory_profile import ProfileStep
from argosy.engine.sampler import Sampler
from argosy.engine.sampling_params import SamplingParams
from argosy.engine.sequence import Sequence

if TYPE_CHECKING:
    from argosy.engine.model_runner import ModelRunner


def split_tokens(total: int, most_seqs: int, longest: int) -> list[int]:
    """total tokens over as many sequences as allowed (at least enough that none is over longest),
    as evenly as possible."""
    n = max(1, min(most_seqs, total), -(-total // longest))
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


def run_dummy_step(runner: ModelRunner, lengths: list[int], params: SamplingParams, sample: bool) -> int:
    """One step computing prompts of these lengths (each sampled), over a temporary KV cache; returns
    that cache's bytes."""
    bs = runner.block_size
    seqs, next_block = [], 0
    for i, n in enumerate(lengths):
        seq = Sequence(f"profile-{i}", [i % runner.model_config.vocab_size] * n, params)
        seq.block_ids = list(range(next_block, next_block + -(-n // bs)))
        next_block += len(seq.block_ids)
        seqs.append(seq)
    runner.allocate_kv_cache(next_block)
    scaffolding = next_block * runner.kv_bytes_per_block()
    try:
        logits = runner.execute(runner.prepare([(seq, len(seq.token_ids)) for seq in seqs]))
        if sample:
            Sampler(runner.model_config.vocab_size, set(), seed=0)(logits, seqs)
        del logits
    finally:
        runner.kv_caches = []
    return scaffolding


def largest_step(runner: ModelRunner) -> ProfileStep:
    """The token budget spread over max_num_seqs sequences, every one sampled with top-k, top-p, min-p,
    a penalty and the most logprobs allowed (the sampler's largest temporaries)."""
    config = runner.config
    lengths = split_tokens(config.token_budget(runner.device), config.max_num_seqs,
                           config.max_model_len or runner.model_config.max_position_embeddings)
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, min_p=0.05, repetition_penalty=1.1,
                            logprobs=config.max_logprobs)
    return lambda: run_dummy_step(runner, lengths, params, sample=True)


def largest_decode(runner: ModelRunner, size: int) -> ProfileStep:
    """A decode step of `size` sequences (what the largest CUDA graph holds: its memory pool is its own)."""
    return lambda: run_dummy_step(runner, [1] * size, SamplingParams(temperature=0), sample=False)
