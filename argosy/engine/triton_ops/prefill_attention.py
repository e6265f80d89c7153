"""Paged prefill attention over variable-length chunks: the prefill chunks of a step (whole prompts, the
rest of a prompt after a prefix-cache hit, or one chunk of a chunked prefill) in one launch.

A step writes every new K/V into the cache before attention reads it, so a chunk's keys are all in the
cache: the earlier context and the chunk's own tokens alike, read through its block table. Query i of a
chunk of q_len tokens sits at position context_len - q_len + i and sees the keys at positions up to its
own (causal). One program per (chunk, tile of BLOCK_M queries, query head); programs past a chunk's
length run no iterations and store nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from argosy.engine.triton_ops import Launch, dot_constants, next_pow2
from argosy.engine.triton_ops.decode_attention import LOG2E
from argosy.engine.triton_ops.dot import mma

BLOCK_M = 32  # queries per program
BLOCK_N = 32  # keys per tile


# Widths and the offsets of the per-chunk arrays (views into one host-to-device copy) vary from step to
# step: no specialisation on them, so no recompiles mid-run.
@triton.jit(do_not_specialize=["stride_bt"],
            do_not_specialize_on_alignment=["query_start_ptr", "query_len_ptr", "context_len_ptr"])
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_table_ptr, query_start_ptr, query_len_ptr, context_len_ptr,
    scale_log2, stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_ct, stride_ch, stride_bt,
    QUERIES_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_M: tl.constexpr, TILE_N: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
):
    chunk = tl.program_id(0)
    m_block = tl.program_id(1)
    head = tl.program_id(2)
    kv_head = head // QUERIES_PER_KV
    q_start = tl.load(query_start_ptr + chunk).to(tl.int32)
    q_len = tl.load(query_len_ptr + chunk).to(tl.int32)
    context_len = tl.load(context_len_ptr + chunk).to(tl.int32)

    i = m_block * TILE_M + tl.arange(0, TILE_M)
    d = tl.arange(0, DIM_PAD)
    i_ok = i < q_len
    d_ok = d < HEAD_DIM
    q_pos = context_len - q_len + i
    q = tl.load(q_ptr + (q_start + i)[:, None] * stride_qt + head * stride_qh + d[None, :],
                mask=i_ok[:, None] & d_ok[None, :], other=0.0)
    # Keys up to the last query of this tile; none for a tile past the chunk's end.
    key_end = tl.minimum(context_len, context_len - q_len + (m_block + 1) * TILE_M)
    key_end = tl.where(m_block * TILE_M < q_len, key_end, 0)
    m_i = tl.full([TILE_M], float("-inf"), tl.float32)
    l_i = tl.zeros([TILE_M], tl.float32)
    acc = tl.zeros([TILE_M, DIM_PAD], tl.float32)
    n = tl.arange(0, TILE_N)
    for start in range(0, key_end, TILE_N):
        tok = start + n
        tok_ok = tok < key_end
        block = tl.load(block_table_ptr + chunk * stride_bt + tok // BLOCK_SIZE, mask=tok_ok, other=0)
        row = block.to(tl.int64) * stride_cb + (tok % BLOCK_SIZE) * stride_ct + kv_head * stride_ch
        kv_mask = tok_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = mma(q, tl.trans(k), DOT_PRECISION, DOT_UPCAST) * scale_log2
        # Every row sees key 0 in the first tile, so its running max is finite from then on.
        s = tl.where(tok_ok[None, :] & (tok[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, DOT_PRECISION, DOT_UPCAST)
        m_i = m_new
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + (q_start + i)[:, None] * stride_ot + head * stride_oh + d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=i_ok[:, None] & d_ok[None, :])


def prefill_launch(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, query_start: torch.Tensor,
                   query_len: torch.Tensor, context_len: torch.Tensor, max_query_len: int, scale: float,
                   out: torch.Tensor) -> Launch:
    """q, out [T, heads, dim] (the step's flattened tokens); block_table [chunks, width]; query_start,
    query_len, context_len [chunks] integers; max_query_len the longest chunk (sizes the grid)."""
    _, num_heads, head_dim = q.shape
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    assert q.stride(2) == 1 and out.stride(2) == 1 and kv_cache.is_contiguous() and num_heads % num_kv_heads == 0
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    grid = (len(query_len), -(-max_query_len // BLOCK_M), num_heads)
    return Launch(
        _prefill_kernel, grid,
        (q, k_cache, v_cache, out, block_table, query_start, query_len, context_len, scale * LOG2E,
         q.stride(0), q.stride(1), out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1),
         k_cache.stride(2), block_table.stride(0)),
        dict(QUERIES_PER_KV=num_heads // num_kv_heads, HEAD_DIM=head_dim, DIM_PAD=max(16, next_pow2(head_dim)),
             BLOCK_SIZE=block_size, TILE_M=BLOCK_M, TILE_N=BLOCK_N, **dot_constants(q.dtype)))


def paged_prefill_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                            query_start: torch.Tensor, query_len: torch.Tensor, context_len: torch.Tensor,
                            max_query_len: int, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    out = torch.empty_like(q) if out is None else out
    prefill_launch(q, kv_cache, block_table, query_start, query_len, context_len, max_query_len, scale, out).run()
    return out
