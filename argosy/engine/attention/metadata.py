"""What a step tells attention: where each token's K/V go, and which cached blocks each query reads.

The batch is flattened to T tokens. Decodes (one query token each) come first, in groups that one
attention call takes; each prefill chunk follows on its own, since its query length differs. Which
decodes share a group is the attention backend's choice (`AttentionBackend.decode_groups`); every
backend must still attend to any group another one built (a parallel rank may lack the driver's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
class PackedPrefills:
    """Every prefill chunk of a step as tensors, for a kernel that attends them all in one launch and
    reads each chunk's whole context (its own tokens too, written first) through its block table."""

    query_start: torch.Tensor  # [chunks] int64
    query_len: torch.Tensor
    context_len: torch.Tensor
    block_table: torch.Tensor  # [chunks, max_blocks] int64 (padded with block 0)
    max_query_len: int


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] cache slot written by each token
    decode_groups: list[DecodeGroup]  # the decodes come first in the batch
    prefills: list[PrefillChunk]
    packed_prefills: PackedPrefills | None = None  # set by backends whose kernel wants them (pack_prefills)
