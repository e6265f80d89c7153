"""The K/V write: each new token's keys and values into its cache slot, one program per token (all its
KV heads). A negative slot is skipped (a padding row)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from argosy.engine.triton_ops import Launch, next_pow2


@triton.jit(do_not_specialize_on_alignment=["slot_ptr"])  # a view into the step's one copy: offsets vary
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_cb, stride_ct, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, DIM_PAD)
    rows_ok = (h < NUM_KV_HEADS) & (slot + 0 * h >= 0)  # the slot broadcast first: the interpreter wants a block
    mask = rows_ok[:, None] & (d < HEAD_DIM)[None, :]
    dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_ct + h[:, None] * stride_ch + d[None, :]
    k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask, other=0.0)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask, other=0.0)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_launch(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> Launch:
    """kv_cache [2, blocks, block_size, kv_heads, dim] contiguous; k, v [T, kv_heads, dim] (each head's dim
    contiguous, any token stride: views into the fused qkv projection); slot_mapping [T] integers."""
    t, num_kv_heads, head_dim = k.shape
    assert kv_cache.is_contiguous() and k.stride(2) == v.stride(2) == 1 and len(slot_mapping) == t
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    return Launch(
        _write_kv_kernel, (t,),
        (k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
         k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)),
        dict(NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, HEADS_PAD=next_pow2(num_kv_heads),
             DIM_PAD=next_pow2(head_dim), BLOCK_SIZE=kv_cache.shape[2]), num_warps=1)


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    write_kv_launch(kv_cache, k, v, slot_mapping).run()
