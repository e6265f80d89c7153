"""Paged attention: each sequence's K/V live in fixed-size blocks found through its block table.

The batch is flattened to T tokens. Decodes (one query token each) come first and run as one
batched attention call; each prefill chunk runs on its own, since its query length differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillChunk:
    query_start: int  # index of its first token in the flattened batch
    query_len: int
    context_len: int  # tokens in the cache after this step (earlier ones + this chunk)
    slots: torch.Tensor | None  # [context_len] cache slots to read; None when nothing was cached before


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] cache slot written by each token
    num_decodes: int
    decode_slots: torch.Tensor | None  # [num_decodes, max_len] slots of each decode's context (padded)
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_len] True where a slot is real
    prefills: list[PrefillChunk]


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """kv_cache: [2, num_blocks, block_size, kv_heads, head_dim]; k, v: [T, kv_heads, head_dim]."""
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
    flat_k = kv_cache[0].view(-1, num_kv_heads, head_dim)
    flat_v = kv_cache[1].view(-1, num_kv_heads, head_dim)
    out = torch.empty_like(q)

    nd = meta.num_decodes
    if nd:
        # One query per sequence: fold the query heads that share a KV head into the "query length"
        # axis ([nd, kv_heads, group, dim]), so grouped-query attention needs no repeat of K/V.
        qd = q[:nd].view(nd, num_kv_heads, group, head_dim)
        slots = meta.decode_slots
        kd = flat_k[slots].transpose(1, 2)  # [nd, kv_heads, max_len, dim]
        vd = flat_v[slots].transpose(1, 2)
        od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=meta.decode_mask, scale=scale)
        out[:nd] = od.reshape(nd, num_heads, head_dim)

    for chunk in meta.prefills:
        s, n = chunk.query_start, chunk.query_len
        qp = q[s:s + n].transpose(0, 1).unsqueeze(0)  # [1, heads, n, dim]
        if chunk.slots is None:  # nothing cached before: attend to this chunk's own K/V, causally
            kp, vp, mask, causal = k[s:s + n], v[s:s + n], None, True
        else:
            kp, vp = flat_k[chunk.slots], flat_v[chunk.slots]
            # Query i sits at position context_len - n + i and sees keys up to that position.
            mask = torch.ones(n, chunk.context_len, dtype=torch.bool, device=q.device)
            mask = mask.tril(chunk.context_len - n)
            causal = False
        kp = kp.transpose(0, 1).unsqueeze(0)
        vp = vp.transpose(0, 1).unsqueeze(0)
        op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, is_causal=causal, scale=scale,
                                            enable_gqa=group > 1)
        out[s:s + n] = op[0].transpose(0, 1)
    return out
