"""Paged decode attention, flash-decoding style: one query token per sequence, its context split across
programs (each a partial softmax over its share of the tiles), then a reduction over the splits.

Stage 1 runs one program per (sequence, KV head, split); the program handles all the query heads that
share its KV head (grouped-query attention), so each K/V tile is read once for the group, and uses the
tensor cores through tl.dot with the group padded to 16 rows. Tokens are gathered slot by slot through
the block table, so any block size works (1 to 256) with the same tile. Stage 2 runs one program per
(sequence, query head) and merges the splits' (max, sum, weighted values).

Everything the launch depends on is either a tensor or fixed by the batch size (the number of splits),
so a decode step captured in a CUDA graph replays correctly for new context lengths and block tables.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from argosy.engine.triton_ops import Launch, dot_constants, next_pow2
from argosy.engine.triton_ops.dot import mma

LOG2E = 1.4426950408889634
TILE = 32  # tokens per K/V tile: a multiple of 16 (tl.dot), small enough to split short contexts
MAX_SPLITS = 16
TARGET_PROGRAMS = 2 * 132  # two waves on an H200's 132 SMs: enough programs to keep HBM busy


def num_splits_for(num_seqs: int, num_kv_heads: int, max_splits: int = MAX_SPLITS) -> int:
    """Splits per sequence, from the batch size alone (a captured graph fixes it): a few sequences get
    many splits, so that even one stream keeps every SM reading; a large batch gets one."""
    programs = max(1, num_seqs * num_kv_heads)
    return max(1, min(max_splits, next_pow2(-(-TARGET_PROGRAMS // programs))))


# Table widths vary from step to step (eager): no specialisation on them, so no recompiles mid-run.
@triton.jit(do_not_specialize=["stride_bt"], do_not_specialize_on_alignment=["context_lens_ptr"])
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, context_lens_ptr,
    part_max_ptr, part_sum_ptr, part_acc_ptr, scale_log2,
    stride_qt, stride_qh, stride_cb, stride_ct, stride_ch, stride_bt,
    NUM_HEADS: tl.constexpr, QUERIES_PER_KV: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    num_tiles = tl.cdiv(context_len, TILE_N)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    first = split * tiles_per_split
    last = tl.minimum(first + tiles_per_split, num_tiles)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM_PAD)
    head = kv_head * QUERIES_PER_KV + g
    g_ok = g < QUERIES_PER_KV
    d_ok = d < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    n = tl.arange(0, TILE_N)
    for t in range(first, last):
        tok = t * TILE_N + n
        tok_ok = tok < context_len
        block = tl.load(block_table_ptr + seq * stride_bt + tok // BLOCK_SIZE, mask=tok_ok, other=0)
        row = block.to(tl.int64) * stride_cb + (tok % BLOCK_SIZE) * stride_ct + kv_head * stride_ch
        kv_mask = tok_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = mma(q, tl.trans(k), DOT_PRECISION, DOT_UPCAST) * scale_log2
        s = tl.where(tok_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: a tile in range holds at least one token
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, DOT_PRECISION, DOT_UPCAST)
        m_i = m_new
    part = (seq * NUM_HEADS + head) * NUM_SPLITS + split  # an empty split leaves (-inf, 0, 0)
    tl.store(part_max_ptr + part, m_i, mask=g_ok)
    tl.store(part_sum_ptr + part, l_i, mask=g_ok)
    tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])

@triton.jit
def _decode_reduce_kernel(
    part_max_ptr, part_sum_ptr, part_acc_ptr, out_ptr, stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, DIM_PAD)
    s_ok = s < NUM_SPLITS
    d_ok = d < HEAD_DIM
    part = (seq * NUM_HEADS + head) * NUM_SPLITS + s
    m = tl.load(part_max_ptr + part, mask=s_ok, other=float("-inf"))
    l_s = tl.load(part_sum_ptr + part, mask=s_ok, other=0.0)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                  other=0.0)
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # no token at all (an empty padding row)
    w = tl.where(l_s > 0, tl.exp2(m - m_max), 0.0)
    total = tl.sum(l_s * w, 0)
    o = tl.sum(acc * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + d, o.to(out_ptr.dtype.element_ty), mask=d_ok)


def decode_launches(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, context_lens: torch.Tensor,
                    scale: float, out: torch.Tensor, num_splits: int | None = None) -> list[Launch]:
    """q [n, heads, dim] (each head's dim contiguous); kv_cache [2, blocks, block_size, kv_heads, dim]
    contiguous; block_table [n, width] and context_lens [n] integers (a length may be 0: that row's
    output is 0); out like q. Returns the two launches (split, reduce)."""
    n, num_heads, head_dim = q.shape
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    assert q.stride(2) == 1 and out.stride(2) == 1 and kv_cache.is_contiguous() and num_heads % num_kv_heads == 0
    group = num_heads // num_kv_heads
    splits = num_splits or num_splits_for(n, num_kv_heads)
    part_max = torch.empty((n, num_heads, splits), dtype=torch.float32, device=q.device)
    part_sum = torch.empty_like(part_max)
    part_acc = torch.empty((n, num_heads, splits, head_dim), dtype=torch.float32, device=q.device)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    dim_pad = max(16, next_pow2(head_dim))
    split_launch = Launch(
        _decode_split_kernel, (n, num_kv_heads, splits),
        (q, k_cache, v_cache, block_table, context_lens, part_max, part_sum, part_acc, scale * LOG2E,
         q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0)),
        dict(NUM_HEADS=num_heads, QUERIES_PER_KV=group, GROUP_PAD=max(16, next_pow2(group)), HEAD_DIM=head_dim,
             DIM_PAD=dim_pad, BLOCK_SIZE=block_size, TILE_N=TILE, NUM_SPLITS=splits,
             **dot_constants(q.dtype)))
    reduce_launch = Launch(
        _decode_reduce_kernel, (n, num_heads),
        (part_max, part_sum, part_acc, out, out.stride(0), out.stride(1)),
        dict(NUM_HEADS=num_heads, NUM_SPLITS=splits, SPLITS_PAD=next_pow2(splits), HEAD_DIM=head_dim,
             DIM_PAD=dim_pad), num_warps=1)
    return [split_launch, reduce_launch]


def paged_decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                           context_lens: torch.Tensor, scale: float, num_splits: int | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """One query per sequence over its paged context -> [n, heads, dim] in q's dtype."""
    out = torch.empty_like(q) if out is None else out
    for launch in decode_launches(q, kv_cache, block_table, context_lens, scale, out, num_splits):
        launch.run()
    return out
