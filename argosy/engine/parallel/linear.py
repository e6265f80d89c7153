"""Tensor-parallel layers (Megatron-style).

Column-parallel layers (the merged q/k/v and gate/up projections) need no class of their own: each
rank holds a plain nn.Linear over its rows of the weight (its heads, its slice of the intermediate
size), and its output stays local. A row-parallel layer (o_proj, down_proj) consumes that local slice
with its matching columns and sums the partial products over the ranks: one all-reduce each.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from argosy.engine.parallel.state import ParallelState


def vocab_range(vocab_size: int, ps: ParallelState) -> tuple[int, int, int]:
    """(first row, rows held, rows allocated) of this rank's vocabulary shard; the last one may be short."""
    per_rank = -(-vocab_size // ps.tp_size)
    start = min(ps.tp_rank * per_rank, vocab_size)
    return start, min(per_rank, vocab_size - start), per_rank


class RowParallelLinear(nn.Linear):
    """y = sum over ranks of x_r @ W_r^T, then the bias once (it is held whole by every rank)."""

    def __init__(self, in_features_per_rank: int, out_features: int, bias: bool, ps: ParallelState):
        super().__init__(in_features_per_rank, out_features, bias=bias)
        self.ps = ps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ps.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Each rank looks up the ids in its vocabulary range and zeros the rest; the all-reduce fills them in."""

    def __init__(self, vocab_size: int, hidden_size: int, ps: ParallelState):
        super().__init__()
        self.ps = ps
        self.start, self.rows, per_rank = vocab_range(vocab_size, ps)
        self.weight = nn.Parameter(torch.empty(per_rank, hidden_size))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.ps.tp_group is None:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.rows)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.ps.all_reduce(x.masked_fill(outside.unsqueeze(-1), 0))


class ParallelLMHead(nn.Module):
    """Each rank computes the logits of its vocabulary rows; they are gathered on tp rank 0 only
    (the others return None), since only the driver samples."""

    def __init__(self, vocab_size: int, hidden_size: int, ps: ParallelState):
        super().__init__()
        self.ps = ps
        self.vocab_size = vocab_size
        self.start, self.rows, per_rank = vocab_range(vocab_size, ps)
        self.weight = nn.Parameter(torch.empty(per_rank, hidden_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        logits = self.ps.gather_last_dim(F.linear(hidden, self.weight))
        # Padding rows (vocab not divisible by the ranks) come last and are cut off.
        return None if logits is None else logits[:, :self.vocab_size]
