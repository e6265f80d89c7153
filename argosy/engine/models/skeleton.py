"""Model skeletons: every model (decoder, encoder) is built on the meta device, then given memory and loaded."""

from __future__ import annotations

import torch
from torch import nn


def unfilled_embedding(num: int, dim: int) -> nn.Embedding:
    """An nn.Embedding whose weight is left unfilled. nn.Embedding's own random fill (normal_) on a meta
    tensor imports torch._dynamo: 0.6-0.9 s of a 2 s replica start on the CPU, for weights loading replaces."""
    return nn.Embedding(num, dim, _weight=torch.empty(num, dim))


def materialize(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A meta-device skeleton given unfilled memory on `device`, its floating-point tensors in `dtype`: what
    `model.to_empty(device=device).to(dtype)` gives, without to_empty's torch.empty_like, which on a meta
    tensor imports sympy (0.3 s of a start), nor a second copy of every weight for the dtype."""
    return model._apply(lambda t: torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype,
                                              device=device))
