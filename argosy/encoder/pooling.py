"""From token states to one vector per sequence (sentence-transformers' Pooling and Normalize), in float32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from argosy.encoder.batch import PackedBatch


def _segment_sum(hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    seq_of_row = torch.repeat_interleave(torch.arange(len(batch.lengths), device=hidden.device), batch.lengths)
    out = torch.zeros(len(batch.lengths), hidden.shape[1], dtype=hidden.dtype, device=hidden.device)
    return out.index_add_(0, seq_of_row, hidden)


def pool(hidden: torch.Tensor, batch: PackedBatch, modes: tuple[str, ...], normalize: bool) -> torch.Tensor:
    """[B, dimensions]: the modes' vectors concatenated in the order given (sentence-transformers' order)."""
    hidden = hidden.float()
    lengths = batch.lengths.to(hidden.dtype)[:, None]
    parts = []
    for mode in modes:
        if mode == "cls":
            parts.append(hidden.index_select(0, batch.starts))
        elif mode == "lasttoken":
            parts.append(hidden.index_select(0, batch.starts + batch.lengths - 1))
        elif mode == "max":
            parts.append(torch.segment_reduce(hidden, "max", lengths=batch.lengths, axis=0))
        elif mode == "mean":
            parts.append(_segment_sum(hidden, batch) / lengths)
        elif mode == "mean_sqrt_len":
            parts.append(_segment_sum(hidden, batch) / torch.sqrt(lengths))
        else:
            raise ValueError(f"unknown pooling mode {mode!r}")
    vectors = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    return F.normalize(vectors, p=2, dim=1) if normalize else vectors
