"""Attention backends: each says which devices and dtypes it runs on; the runner takes the first that
does, by priority. A new kernel (a CUDA paged kernel, say) is a new module with one class and one
`register_backend` call, imported by this package's __init__; the others stay as they are."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from argosy.engine.attention.metadata import AttentionMetadata, DecodeGroup, PackedPrefills, PrefillChunk


@dataclass(frozen=True)
class AttentionContext:
    """What a backend is built for: one runner's cache and its platform's bounds."""

    device: torch.device
    dtype: torch.dtype
    block_size: int
    kv_block_bytes: int  # K and V of one block of one layer (this rank's heads)
    decode_copy_bytes: int | None = None  # the most K/V one gathered decode group may copy (None: no bound)

    @classmethod
    def for_cache(cls, kv_cache: torch.Tensor) -> AttentionContext:
        """kv_cache [2, num_blocks, block_size, kv_heads, head_dim]."""
        block_bytes = kv_cache[:, 0].numel() * kv_cache.element_size()
        return cls(kv_cache.device, kv_cache.dtype, kv_cache.shape[2], block_bytes)


class AttentionBackend(ABC):
    name: ClassVar[str]

    def __init__(self, ctx: AttentionContext):
        self.ctx = ctx

    @classmethod
    @abstractmethod
    def supports(cls, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether it runs here (a kernel that could not be built says no)."""

    @classmethod
    def chosen_by_default(cls, device: torch.device) -> bool:
        """Whether select_backend may pick it without being asked by name (a backend that runs on a device
        only for testing, as Triton's interpreter on the CPU, says no there)."""
        return True

    # True when decode_groups makes one group of fixed-shape tensors (block_table, context_lens) and the
    # decode kernel reads every length from them: a captured decode step (CUDA graph) replays correctly.
    captures_decodes: ClassVar[bool] = False

    def pack_prefills(self, chunks: list[PrefillChunk], tables: list[list[int]]) -> PackedPrefills | None:
        """The prefill chunks as tensors for a kernel that takes them all in one launch (None: the
        backend attends chunk by chunk); tables[i] are chunk i's block ids, covering its context."""
        return None

    @abstractmethod
    def decode_groups(self, tables: list[list[int]], lens: list[int]) -> list[DecodeGroup]:
        """Groups a step's decodes, sorted by context length: tables are their block ids, lens their
        context lengths (this step's token included)."""

    @abstractmethod
    def write_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """kv_cache [2, num_blocks, block_size, kv_heads, head_dim]; k, v [T, kv_heads, head_dim]."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q [T, heads, head_dim]; k, v this step's keys and values, already written to the cache."""


_BACKENDS: dict[str, tuple[int, type[AttentionBackend]]] = {}


def register_backend(name: str, cls: type[AttentionBackend], priority: int = 0) -> None:
    """Makes cls selectable; among those that support a device and dtype, the highest priority wins."""
    cls.name = name
    _BACKENDS[name] = (priority, cls)


def backend_names() -> list[str]:
    return [name for name, _ in sorted(_BACKENDS.items(), key=lambda kv: -kv[1][0])]


def select_backend(device: torch.device, dtype: torch.dtype, name: str | None = None) -> type[AttentionBackend]:
    """The named backend (which must support device and dtype), or the best one that does."""
    if name is not None:
        if name not in _BACKENDS:
            raise ValueError(f"unknown attention backend {name!r}; registered: {', '.join(backend_names())}")
        cls = _BACKENDS[name][1]
        if not cls.supports(device, dtype):
            raise ValueError(f"attention backend {name!r} does not run on {device.type} in {dtype}")
        return cls
    for candidate in backend_names():
        cls = _BACKENDS[candidate][1]
        if cls.supports(device, dtype) and cls.chosen_by_default(device):
            return cls
    raise ValueError(f"no attention backend runs on {device.type} in {dtype}")


def create_backend(ctx: AttentionContext, name: str | None = None) -> AttentionBackend:
    return select_backend(ctx.device, ctx.dtype, name)(ctx)
