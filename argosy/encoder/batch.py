"""A packed batch: the sequences' tokens end to end, and how attention groups them.

The linear layers and norms (most of the work) run on the packed real tokens only. Attention needs
each sequence to see only its own tokens; SDPA on the CPU is several times faster as one call over a
padded [count, length] block than as one call per sequence (measured: 30 sequences of 140 tokens took
~115 ms as one call against ~780 ms as thirty), so the sequences, longest first, are cut into groups
whose padding to the group's longest stays within PAD_SLACK of their real tokens, and each group is one
masked call. A group of equal lengths is a plain view of the packed rows: no copy, no mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD_SLACK = 1.3  # padded tokens / real tokens allowed in one attention group


@dataclass(frozen=True)
class AttentionGroup:
    start: int  # its rows in the packed batch
    end: int
    count: int  # sequences
    length: int  # the longest; the others are padded to it inside attention
    gather: torch.Tensor | None  # [count * length] rows (relative to start); None: equal lengths, a plain view
    keep: torch.Tensor | None  # [end - start] rows of the padded block that are real tokens
    mask: torch.Tensor | None  # [count, 1, 1, length] keys a query may attend to


@dataclass(frozen=True)
class PackedBatch:
    input_ids: torch.Tensor  # [T]
    token_type_ids: torch.Tensor  # [T]
    position_ids: torch.Tensor  # [T]
    starts: torch.Tensor  # [B] first row of each sequence (its [CLS])
    lengths: torch.Tensor  # [B]
    groups: tuple[AttentionGroup, ...]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def attention_groups(lengths: list[int], slack: float = PAD_SLACK) -> list[tuple[int, int]]:
    """[first, last) sequence ranges; lengths in non-increasing order."""
    groups, first, real = [], 0, 0
    for i, n in enumerate(lengths):
        if i > first and (i + 1 - first) * lengths[first] > slack * (real + n):
            groups.append((first, i))
            first, real = i, 0
        real += n
    if lengths:
        groups.append((first, len(lengths)))
    return groups


def _group(start: int, lengths: list[int], device: torch.device) -> AttentionGroup:
    count, longest, total = len(lengths), lengths[0], sum(lengths)
    if lengths[-1] == longest:
        return AttentionGroup(start, start + total, count, longest, None, None, None)
    lens = torch.tensor(lengths, dtype=torch.long)
    offsets = torch.cumsum(lens, 0) - lens
    pos = torch.arange(longest)
    # Padding rows repeat the sequence's last real row: masked out as keys, their outputs dropped.
    gather = (offsets[:, None] + torch.minimum(pos[None, :], lens[:, None] - 1)).reshape(-1)
    real = pos[None, :] < lens[:, None]
    keep = (torch.arange(count)[:, None] * longest + pos[None, :])[real]
    return AttentionGroup(start, start + total, count, longest, gather.to(device), keep.to(device),
                          real[:, None, None, :].to(device))


def pack(sequences: list[tuple[list[int], list[int] | None]], device: torch.device) -> PackedBatch:
    """sequences: (token ids, token type ids or None for all zeros), longest first."""
    lengths = [len(ids) for ids, _ in sequences]
    if any(a < b for a, b in zip(lengths, lengths[1:], strict=False)):
        raise ValueError("pack: sequences must come longest first")
    if not lengths or lengths[-1] < 1:
        raise ValueError("pack: every sequence needs at least one token")
    ids = [t for s, _ in sequences for t in s]
    types = [t for s, tt in sequences for t in (tt if tt is not None else [0] * len(s))]
    positions = [p for n in lengths for p in range(n)]
    lens = torch.tensor(lengths, dtype=torch.long)
    starts = torch.cumsum(lens, 0) - lens
    groups, row = [], 0
    for first, last in attention_groups(lengths):
        g = _group(row, lengths[first:last], device)
        groups.append(g)
        row = g.end

    def as_tensor(xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.long, device=device)

    return PackedBatch(as_tensor(ids), as_tensor(types), as_tensor(positions), starts.to(device), lens.to(device),
                       tuple(groups))
