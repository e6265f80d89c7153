"""The CPU's C kernels (cpu_kernels.py, float32): all of a step's decodes in one call that reads each
block through the block tables in place (csrc/paged_attention.c), and the K/V write in one call.
Prefill chunks go through SDPA as in the gather backend this extends."""

from __future__ import annotations

import torch

from argosy.engine import cpu_kernels
from argosy.engine.attention.metadata import DecodeGroup
from argosy.engine.attention.registry import register_backend
from argosy.engine.attention.sdpa import SdpaBackend


class CpuKernelBackend(SdpaBackend):
    captures_decodes = True  # one group of tensor lengths: what cuda_graphs.py's tests replay on the CPU
    @classmethod
    def supports(cls, device: torch.device, dtype: torch.dtype) -> bool:
        return device.type == "cpu" and dtype == torch.float32 and cpu_kernels.available()

    def decode_groups(self, tables: list[list[int]], lens: list[int]) -> list[DecodeGroup]:
        if not tables:
            return []
        # The kernel reads each decode's own length: one group, no padding attended.
        width = max(map(len, tables))
        table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)
        return [DecodeGroup(0, len(tables), table, None, context_lens=torch.tensor(lens, dtype=torch.long))]

    def write_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        if k.stride(2) == v.stride(2) == 1 and k.stride(1) == v.stride(1) == k.shape[2]:  # heads contiguous
            return cpu_kernels.write_kv(kv_cache, k, v, slot_mapping)  # one call instead of two index_copy_
        super().write_kv(kv_cache, k, v, slot_mapping)

    def attend_decodes(self, q: torch.Tensor, kv_cache: torch.Tensor, group: DecodeGroup, scale: float) -> torch.Tensor:
        if group.context_lens is None:  # a group another backend built (gather + SDPA's)
            return super().attend_decodes(q, kv_cache, group, scale)
        return cpu_kernels.paged_decode_attention(q, kv_cache, group.block_table, group.context_lens, scale)


register_backend("cpu_kernel", CpuKernelBackend, priority=10)
