"""CPU layers whose weights stay in GGML's quantized blocks: a Linear and an Embedding (quant_kernels.py).

A merged projection (q/k/v, gate/up) stacks its parts' rows; a GGUF file may quantize the parts
differently (a Q4_K_M file keeps v in Q6_K where q and k are Q4_K), so a QuantLinear holds one segment
per run of rows: a QuantTensor, computed by the C kernel into its columns of the output, or a float32
matrix (a type without a kernel, dequantized at load).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from argosy.engine import quant_kernels
from argosy.engine.quant_kernels import QuantTensor

Segment = QuantTensor | torch.Tensor


def _rows(seg: Segment) -> int:
    return seg.rows if isinstance(seg, QuantTensor) else seg.shape[0]


class QuantLinear(nn.Module):
    def __init__(self, in_features: int, segments: list[Segment], bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features = in_features
        self.segments = segments
        self.out_features = sum(map(_rows, segments))
        for seg in segments:
            cols = seg.cols if isinstance(seg, QuantTensor) else seg.shape[1]
            if cols != in_features:
                raise ValueError(f"a segment of {cols} columns in a linear layer of {in_features} inputs")
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        # The weight types whose products of 3+ rows take bfloat16 operands (set by the CPU platform from
        # quant_batch_dtype: under auto every type but F32, whose file promises float32 arithmetic).
        self.bf16_batch_types: frozenset[int] = frozenset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.in_features).float()
        if len(self.segments) == 1 and isinstance(self.segments[0], QuantTensor):
            seg = self.segments[0]
            y = quant_kernels.matmul(seg, x, bf16=seg.qtype in self.bf16_batch_types)
        else:
            y = x.new_empty((x.shape[0], self.out_features))
            start = 0
            for seg in self.segments:
                end = start + _rows(seg)
                if isinstance(seg, QuantTensor):
                    quant_kernels.matmul(seg, x, out=y[:, start:end], bf16=seg.qtype in self.bf16_batch_types)
                else:
                    y[:, start:end] = F.linear(x, seg)
                start = end
        if self.bias is not None:
            y += self.bias
        return y.view(*shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        return sum(s.data.numel() if isinstance(s, QuantTensor) else s.numel() * s.element_size()
                   for s in self.segments)

    def extra_repr(self) -> str:
        kinds = "+".join(s.name if isinstance(s, QuantTensor) else str(s.dtype).removeprefix("torch.")
                         for s in self.segments)
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={kinds}"


class QuantEmbedding(nn.Module):
    """Looks up rows of a quantized [vocab, hidden] table, dequantized exactly as GGML does."""

    def __init__(self, table: QuantTensor):
        super().__init__()
        self.table = table
        # The model reads embed_tokens.weight.dtype for the dtype of its rotary tables: float32 here.
        self.weight = torch.empty(0, dtype=torch.float32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return quant_kernels.dequantize_rows(self.table, ids).view(*ids.shape, self.table.cols)

    def extra_repr(self) -> str:
        return f"{self.table.rows}, {self.table.cols}, weights={self.table.name}"
