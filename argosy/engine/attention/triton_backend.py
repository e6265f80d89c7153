"""Triton paged attention (triton_ops/): the attention backend on CUDA.

All of a step's decodes go to one flash-decoding launch over their block tables (one group of fixed-shape
tensors, so a captured decode step replays: captures_decodes); all its prefill chunks go to one
variable-length launch that reads each chunk's context, its own new tokens included, from the paged cache;
the K/V write is one launch per layer. Groups or chunks built by another backend (a parallel rank without
Triton, say) are attended through gather + SDPA, as that backend would.

On the CPU it runs only under Triton's interpreter, and only when asked for by name (tests).
"""

from __future__ import annotations

import torch

from argosy.engine import triton_ops
from argosy.engine.attention.metadata import AttentionMetadata, DecodeGroup, PackedPrefills, PrefillChunk
from argosy.engine.attention.registry import register_backend
from argosy.engine.attention.sdpa import SdpaBackend, attend_prefill
from argosy.engine.host_tensors import rows_to_device, to_device

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class TritonBackend(SdpaBackend):
    captures_decodes = True

    @classmethod
    def supports(cls, device: torch.device, dtype: torch.dtype) -> bool:
        return triton_ops.runs_on(device) and dtype in DTYPES

    @classmethod
    def chosen_by_default(cls, device: torch.device) -> bool:
        return device.type == "cuda"

    def decode_groups(self, tables: list[list[int]], lens: list[int]) -> list[DecodeGroup]:
        if not tables:
            return []
        device = self.ctx.device
        table = rows_to_device(tables, max(map(len, tables)), device)
        return [DecodeGroup(0, len(tables), table, None, context_lens=to_device(lens, torch.long, device))]

    def pack_prefills(self, chunks: list[PrefillChunk], tables: list[list[int]]) -> PackedPrefills:
        device = self.ctx.device
        spans = [c.query_start for c in chunks] + [c.query_len for c in chunks] + [c.context_len for c in chunks]
        flat = to_device(spans, torch.long, device)
        n, width = len(chunks), max(map(len, tables))
        return PackedPrefills(flat[:n], flat[n:2 * n], flat[2 * n:], rows_to_device(tables, width, device),
                              max(c.query_len for c in chunks))

    def write_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        from argosy.engine.triton_ops.kv_write import write_kv

        write_kv(kv_cache, k, v, slot_mapping)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        from argosy.engine.triton_ops.decode_attention import paged_decode_attention
        from argosy.engine.triton_ops.prefill_attention import paged_prefill_attention

        out = torch.empty_like(q)
        for group in meta.decode_groups:
            s, n = group.start, group.count
            if group.context_lens is None:  # a group gather + SDPA built
                out[s:s + n] = super().attend_decodes(q[s:s + n], kv_cache, group, scale)
            else:
                paged_decode_attention(q[s:s + n], kv_cache, group.block_table, group.context_lens, scale,
                                       out=out[s:s + n])
        packed = meta.packed_prefills
        if packed is not None:
            paged_prefill_attention(q, kv_cache, packed.block_table, packed.query_start, packed.query_len,
                                    packed.context_len, packed.max_query_len, scale, out=out)
        else:
            for chunk in meta.prefills:
                s, n = chunk.query_start, chunk.query_len
                out[s:s + n] = attend_prefill(q[s:s + n], k[s:s + n], v[s:s + n], kv_cache, chunk, scale)
        return out


if triton_ops.available():
    register_backend("triton", TritonBackend, priority=20)
