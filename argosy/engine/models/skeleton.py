"""Model skeletons: every model (decoder, encoder) is built on the meta device, then given memory and loaded."""

from __future__ import annotations

import torch
from torch import nn


def unfilled_embedding(num: int, dim: int) -> nn.Embedding:
    """An nn.Embedding whose weight is left unfilled. nn.Embedding's own random fill (normal_) on a meta
    tensor imports torch._dynamo: 0.6-0.9 s of a 2 s replica start on the CPU, for weights loading replaces."""
    return nn.Embedding(num, dim, _weight=torch.empty(num, dim))
