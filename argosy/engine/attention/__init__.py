"""Paged attention: each sequence's K/V live in fixed-size blocks found through its block table.

metadata.py    what a step tells attention (slot mapping, decode groups, prefill chunks)
registry.py    AttentionBackend, register_backend, select_backend (by device and dtype)
sdpa.py        gather + SDPA: any device and dtype (the fallback)
cpu_kernel.py  the CPU's C decode kernel and K/V write (float32, where the kernels could be built)
triton_backend.py  Triton paged attention (triton_ops/): CUDA's, where triton is installed

A new backend is one more module here, imported below so that it registers.
"""

from __future__ import annotations

import torch

from argosy.engine.attention import cpu_kernel, sdpa, triton_backend  # noqa: F401 - each registers its backend
from argosy.engine.attention.metadata import AttentionMetadata, DecodeGroup, PackedPrefills, PrefillChunk
from argosy.engine.attention.registry import (
    AttentionBackend,
    AttentionContext,
    backend_names,
    create_backend,
    register_backend,
    select_backend,
)
from argosy.engine.attention.sdpa import gather_blocks

__all__ = ["AttentionBackend", "AttentionContext", "AttentionMetadata", "DecodeGroup", "PackedPrefills", "PrefillChunk",
           "backend_names", "create_backend", "gather_blocks", "paged_attention", "register_backend",
           "select_backend", "write_kv"]


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Through the best backend for the cache's device and dtype (a model given no backend of its own)."""
    create_backend(AttentionContext.for_cache(kv_cache)).write_kv(kv_cache, k, v, slot_mapping)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Through the best backend for q's device and dtype (a model given no backend of its own)."""
    return create_backend(AttentionContext.for_cache(kv_cache)).forward(q, k, v, kv_cache, meta, scale)
