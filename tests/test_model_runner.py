"""KV-cache sizing and the batch layout the model runner builds."""

import pytest
import torch

from argosy.engine.config import EngineConfig
from argosy.engine.model_runner import ModelRunner
from argosy.engine.sampling_params import SamplingParams
from argosy.engine.sequence import Sequence


@pytest.fixture(scope="module")
def runner(tiny_llama):
    return ModelRunner(EngineConfig(model=tiny_llama, kv_cache_memory_gib=0.01))


def test_kv_cache_fits_its_budget(runner):
    budget = 0.01 * 2**30
    used = sum(t.numel() * t.element_size() for t in runner.kv_caches)
    assert used <= budget
    assert used + runner.kv_bytes_per_block() > budget  # and wastes less than one block
    assert runner.num_blocks == len(runner.kv_caches[0][0])


def test_a_budget_below_two_blocks_is_a_clear_error(tiny_llama):
    with pytest.raises(ValueError, match="kv_cache_memory_gib"):
        ModelRunner(EngineConfig(model=tiny_llama, kv_cache_memory_gib=1e-7))


def test_decodes_are_grouped_by_length_with_bounded_padding(runner):
    bs = runner.block_size
    lengths = [3, 700, 40, 41, 300, 5, 650, 17, 18, 16 * 9]
    seqs, next_block = [], 0
    for n in lengths:
        seq = Sequence("r", list(range(1, n + 1)), SamplingParams())
        blocks = -(-n // bs)
        seq.block_ids = list(range(next_block, next_block + blocks))
        next_block += blocks
        seq.num_computed_tokens = n - 1
        seqs.append(seq)
    batch = runner.prepare([(s, 1) for s in seqs])
    groups = batch.meta.decode_groups
    assert sum(g.count for g in groups) == len(seqs)
    assert [g.start for g in groups] == [sum(g.count for g in groups[:i]) for i in range(len(groups))]
    # Tokens are ordered by context length and every mask marks exactly each sequence's context.
    positions = batch.positions.tolist()
    assert positions == sorted(positions)
    for g in groups:
        real = g.mask.view(g.count, -1).sum(1).tolist()
        assert real == [p + 1 for p in positions[g.start:g.start + g.count]]
        width = g.block_table.shape[1]
        assert g.count * width <= 1.25 * sum(-(-r // bs) for r in real) + width
    assert len(groups) > 1
    # Every sequence samples, and the sampled rows follow the new order.
    assert sorted(s.seq_id for s in batch.sampling_seqs) == sorted(s.seq_id for s in seqs)
    assert torch.equal(batch.sample_indices, torch.arange(len(seqs)))
