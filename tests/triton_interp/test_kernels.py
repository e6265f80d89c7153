"""Each Triton kernel against a float64 reference under the interpreter (tests/kernel_checks.py): head
counts, GQA ratios (1, 3, 4, all heads on one KV head), head sizes (32 to 128, 80 padded), block sizes
(1 to 256), context lengths (0 for a padding row, 1, a block, a block + 1, many blocks) and split counts
(1, a non-power of two, more splits than tiles). Sizes are small: the interpreter is slow."""

from __future__ import annotations

import pytest
import torch

from argosy.engine.triton_ops.decode_attention import num_splits_for
from tests.kernel_checks import check_decode, check_kv_write, check_prefill, check_rms_norm, check_rope

DECODE_CASES = [  # heads, kv_heads, head_dim, block_size, splits, dtype
    (4, 4, 32, 16, 1, torch.float32),
    (8, 2, 64, 16, 4, torch.float32),
    (4, 1, 64, 1, 3, torch.float32),
    (6, 2, 80, 32, 2, torch.float32),
    (4, 2, 128, 256, 8, torch.float32),
    (8, 2, 64, 16, 16, torch.bfloat16),
]
PREFILL_CASES = [  # heads, kv_heads, head_dim, block_size, dtype
    (4, 4, 32, 16, torch.float32),
    (8, 2, 64, 1, torch.float32),
    (6, 2, 80, 32, torch.float32),
    (4, 1, 64, 16, torch.bfloat16),
]


@pytest.mark.parametrize("heads,kv_heads,dim,block_size,splits,dtype", DECODE_CASES)
def test_decode_attention_matches_the_reference(heads, kv_heads, dim, block_size, splits, dtype):
    check_decode("cpu", heads, kv_heads, dim, block_size, splits, dtype)


def test_split_counts_follow_the_batch_and_stay_in_bounds():
    assert num_splits_for(1, 8) == 16  # one stream: every split the partial buffers allow
    assert num_splits_for(256, 8) == 1  # a full batch already fills the GPU
    assert all(1 <= num_splits_for(n, kv) <= 16 for n in (1, 3, 64, 1000) for kv in (1, 8))
    assert num_splits_for(16, 8) < num_splits_for(1, 8)


@pytest.mark.parametrize("heads,kv_heads,dim,block_size,dtype", PREFILL_CASES)
def test_prefill_attention_over_chunks_matches_the_reference(heads, kv_heads, dim, block_size, dtype):
    check_prefill("cpu", heads, kv_heads, dim, block_size, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_write_puts_each_token_in_its_slot_and_skips_padding(dtype):
    check_kv_write("cpu", dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [48, 64])
def test_rms_norm_and_the_fused_residual_add_match_the_reference(dtype, dim):
    check_rms_norm("cpu", dtype, dim, exact_sum=dtype == torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_rotates_q_and_k_in_place_and_leaves_v(dtype):
    check_rope("cpu", dtype)
