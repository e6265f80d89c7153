"""Paged attention: each sequence's K/V live in fixed-size blocks found through its block table.

The batch is flattened to T tokens. Decodes (one query token each) come first and run as one
batched attention call; each prefill chunk runs on its own, since its query length differs. On the CPU
decodes go through a C kernel that reads the cache in place (cpu_kernels.py) where it could be built;
otherwise, and on CUDA, their blocks are gathered and attended with SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from argosy.engine import cpu_kernels


@dataclass
class PrefillChunk:
    query_start: int  # index of its first token in the flattened batch
    query_len: int
    context_len: int  # tokens in the cache after this step (earlier ones + this chunk)
    block_table: torch.Tensor | None  # [blocks] holding the context; None when nothing was cached before
    mask: torch.Tensor | None = None  # [query_len, context_len], built once per step for every layer


@dataclass
class DecodeGroup:
    """Decodes of similar context length, attended in one call; tokens start..start+count of the batch."""

    start: int
    count: int
    block_table: torch.Tensor  # [count, max_blocks] (padded with block 0)
    mask: torch.Tensor | None  # [count, 1, 1, max_blocks * block_size] True where a slot is real
    context_len: int = 0  # a lone decode (count 1) has no mask: its K/V are cut to this length instead
    context_lens: torch.Tensor | None = None  # [count] int64: set (and no mask) for the C decode kernel


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] cache slot written by each token
    decode_groups: list[DecodeGroup]  # the decodes come first in the batch
    prefills: list[PrefillChunk]


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """kv_cache: [2, num_blocks, block_size, kv_heads, head_dim]; k, v: [T, kv_heads, head_dim]."""
    heads_contiguous = k.stride(2) == v.stride(2) == 1 and k.stride(1) == v.stride(1) == k.shape[2]
    cpu = kv_cache.device.type == "cpu" and kv_cache.dtype == torch.float32
    if cpu and heads_contiguous and cpu_kernels.available():
        return cpu_kernels.write_kv(kv_cache, k, v, slot_mapping)  # one call instead of two index_copy_
    flat = kv_cache.view(2, -1, k.shape[1], k.shape[2])
    flat[0].index_copy_(0, slot_mapping, k)
    flat[1].index_copy_(0, slot_mapping, v)


def paged_attention(
    q: torch.Tensor,  # [T, heads, head_dim]
    k: torch.Tensor,  # [T, kv_heads, head_dim] (this step's keys, already written to the cache)
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)

    for grp in meta.decode_groups:
        # One query per sequence: fold the query heads that share a KV head into the "query length"
        # axis ([n, kv_heads, group, dim]), so grouped-query attention needs no repeat of K/V.
        s, n = grp.start, grp.count
        mask = grp.mask
        if grp.context_lens is not None:
            if q.device.type == "cpu" and q.dtype == torch.float32 and cpu_kernels.available():
                out[s:s + n] = cpu_kernels.paged_decode_attention(q[s:s + n], kv_cache, grp.block_table,
                                                                  grp.context_lens, scale)
                continue
            # A rank that could not build the kernel (the driver could): mask the padded group instead.
            width = grp.block_table.shape[1] * kv_cache.shape[2]
            mask = (torch.arange(width, device=q.device) < grp.context_lens.unsqueeze(1)).view(n, 1, 1, width)
        qd = q[s:s + n].view(n, num_kv_heads, group, head_dim)
        kd, vd = gather_blocks(kv_cache, grp.block_table)
        if mask is None:
            kd, vd = kd[:, :grp.context_len], vd[:, :grp.context_len]
        od = F.scaled_dot_product_attention(qd, kd.transpose(1, 2), vd.transpose(1, 2), attn_mask=mask,
                                            scale=scale)
        out[s:s + n] = od.reshape(n, num_heads, head_dim)

    for chunk in meta.prefills:
        s, n = chunk.query_start, chunk.query_len
        qp = q[s:s + n].transpose(0, 1).unsqueeze(0)  # [1, heads, n, dim]
        if chunk.block_table is None:  # nothing cached before: attend to this chunk's own K/V, causally
            kp, vp, mask, causal = k[s:s + n], v[s:s + n], None, True
        else:
            kp, vp = gather_blocks(kv_cache, chunk.block_table.unsqueeze(0))
            kp, vp, mask, causal = kp[0, :chunk.context_len], vp[0, :chunk.context_len], chunk.mask, False
        kp = kp.transpose(0, 1).unsqueeze(0)
        vp = vp.transpose(0, 1).unsqueeze(0)
        op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, is_causal=causal, scale=scale,
                                            enable_gqa=group > 1)
        out[s:s + n] = op[0].transpose(0, 1)
    return out


def gather_blocks(kv_cache: torch.Tensor, block_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the blocks in block_table [rows, blocks] as [rows, blocks * block_size, kv_heads, dim].

    Whole blocks are copied with index_select over a 2-D view ([num_blocks, block_size * heads * dim]):
    on the CPU that is several times faster than gathering slot by slot, or than index_select over the
    4-D tensor. Padded table entries read block 0 and are masked out by the caller.
    """
    rows, nb = block_table.shape
    _, num_blocks, bs, h, d = kv_cache.shape
    idx = block_table.reshape(-1)
    k = kv_cache[0].view(num_blocks, -1).index_select(0, idx).view(rows, nb * bs, h, d)
    v = kv_cache[1].view(num_blocks, -1).index_select(0, idx).view(rows, nb * bs, h, d)
    return k, v
