"""Gather + SDPA: any device, any dtype. Each decode group's blocks are copied out of the cache and
attended with PyTorch's scaled_dot_product_attention; so is each prefill chunk's cached context."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from argosy.engine.attention.metadata import AttentionMetadata, DecodeGroup, PrefillChunk
from argosy.engine.attention.registry import AttentionBackend, AttentionContext, register_backend


class SdpaBackend(AttentionBackend):
    def __init__(self, ctx: AttentionContext):
        super().__init__(ctx)
        # Attention copies each decode group's blocks out of the cache; on the CPU a group whose copy fits
        # in the cores' caches is read back from there by attention instead of from memory.
        copy = ctx.decode_copy_bytes
        self.max_group_blocks = 1 << 30 if copy is None else max(1, copy // ctx.kv_block_bytes)

    @classmethod
    def supports(cls, device: torch.device, dtype: torch.dtype) -> bool:
        return True

    def decode_groups(self, tables: list[list[int]], lens: list[int]) -> list[DecodeGroup]:
        """Splits the (length-sorted) decodes where padding to the group's longest would waste > 25%,
        or where the group would copy more than max_group_blocks blocks."""
        groups, bs, start, device = [], self.ctx.block_size, 0, self.ctx.device
        while start < len(tables):
            end, used = start + 1, len(tables[start])
            while end < len(tables):
                padded = (end - start + 1) * len(tables[end])
                if padded > 1.25 * (used + len(tables[end])) or padded > self.max_group_blocks:
                    break
                used += len(tables[end])
                end += 1
            count, width = end - start, len(tables[end - 1])
            table = torch.tensor([t + [0] * (width - len(t)) for t in tables[start:end]], dtype=torch.long)
            mask, context_len = None, lens[start]  # a lone decode: no padding, its K/V cut to its context
            if count > 1:
                mask = torch.arange(width * bs).unsqueeze(0) < torch.tensor(lens[start:end]).unsqueeze(1)
                mask, context_len = mask.view(count, 1, 1, width * bs).to(device), 0
            groups.append(DecodeGroup(start, count, table.to(device), mask, context_len))
            start = end
        return groups

    def write_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        flat = kv_cache.view(2, -1, k.shape[1], k.shape[2])
        flat[0].index_copy_(0, slot_mapping, k)
        flat[1].index_copy_(0, slot_mapping, v)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        out = torch.empty_like(q)
        for group in meta.decode_groups:
            s, n = group.start, group.count
            out[s:s + n] = self.attend_decodes(q[s:s + n], kv_cache, group, scale)
        for chunk in meta.prefills:
            s, n = chunk.query_start, chunk.query_len
            out[s:s + n] = attend_prefill(q[s:s + n], k[s:s + n], v[s:s + n], kv_cache, chunk, scale)
        return out

    def attend_decodes(self, q: torch.Tensor, kv_cache: torch.Tensor, group: DecodeGroup, scale: float) -> torch.Tensor:
        """q [n, heads, dim], one query per sequence of the group -> out, like q."""
        n, num_heads, head_dim = q.shape
        num_kv_heads = kv_cache.shape[3]
        mask = group.mask
        if group.context_lens is not None:  # a group built for the C kernel: mask its padding instead
            width = group.block_table.shape[1] * kv_cache.shape[2]
            mask = (torch.arange(width, device=q.device) < group.context_lens.unsqueeze(1)).view(n, 1, 1, width)
        # Fold the query heads that share a KV head into the "query length" axis ([n, kv_heads, group,
        # dim]), so grouped-query attention needs no repeat of K/V.
        qd = q.view(n, num_kv_heads, num_heads // num_kv_heads, head_dim)
        kd, vd = gather_blocks(kv_cache, group.block_table)
        if mask is None:
            kd, vd = kd[:, :group.context_len], vd[:, :group.context_len]
        od = F.scaled_dot_product_attention(qd, kd.transpose(1, 2), vd.transpose(1, 2), attn_mask=mask, scale=scale)
        return od.reshape(n, num_heads, head_dim)


def attend_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, chunk: PrefillChunk,
                   scale: float) -> torch.Tensor:
    """One chunk: q, k, v [n, heads or kv_heads, dim] -> out [n, heads, dim]."""
    qp = q.transpose(0, 1).unsqueeze(0)  # [1, heads, n, dim]
    if chunk.block_table is None:  # nothing cached before: attend to this chunk's own K/V, causally
        kp, vp, mask, causal = k, v, None, True
    else:
        kp, vp = gather_blocks(kv_cache, chunk.block_table.unsqueeze(0))
        kp, vp, mask, causal = kp[0, :chunk.context_len], vp[0, :chunk.context_len], chunk.mask, False
    kp = kp.transpose(0, 1).unsqueeze(0)
    vp = vp.transpose(0, 1).unsqueeze(0)
    op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, is_causal=causal, scale=scale,
                                        enable_gqa=q.shape[1] > k.shape[1])
    return op[0].transpose(0, 1)


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


register_backend("sdpa", SdpaBackend, priority=0)
