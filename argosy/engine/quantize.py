"""`--quantization q8_0|q4_0`: a float checkpoint's linear layers quantized at load, on the CPU.

Each nn.Linear's weight goes through the `gguf` package's quantizer (GGML's reference rounding) into
QuantLinear blocks; a token embedding tied to the output layer shares the output's blocks (a
QuantEmbedding). Layers already quantized (a GGUF file's) are left as they are.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

from argosy.engine import quant_kernels
from argosy.engine.quant_decode import install_one_call_decode
from argosy.engine.quant_kernels import QuantTensor
from argosy.engine.quant_linear import QuantEmbedding, QuantLinear

logger = logging.getLogger(__name__)

GGML_TYPES = {"q8_0": 8, "q4_0": 2}


def quantize_matrix(weight: torch.Tensor, kind: str) -> QuantTensor:
    import gguf

    qtype = gguf.GGMLQuantizationType(GGML_TYPES[kind])
    data = gguf.quants.quantize(weight.detach().float().cpu().numpy(), qtype)
    return QuantTensor(int(qtype), torch.from_numpy(np.ascontiguousarray(data)), weight.shape[1])


def quantize_linears(model: nn.Module, kind: str, device: torch.device, dtype: torch.dtype) -> int:
    """Replaces the model's float nn.Linear layers by QuantLinear ones; returns how many."""
    if device.type != "cpu" or dtype != torch.float32 or not quant_kernels.available():
        raise ValueError(f"--quantization {kind} runs on the CPU in float32 with the C kernels built "
                         f"(here: {device.type}, {str(dtype).removeprefix('torch.')})")
    tied = getattr(model, "lm_head", None) is not None and isinstance(model.embed_tokens, nn.Embedding) \
        and model.lm_head.weight is model.embed_tokens.weight
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            if child.in_features % 32:
                logger.warning("%s has %d inputs, not a multiple of 32: kept in float", name, child.in_features)
                continue
            table = quantize_matrix(child.weight, kind)
            bias = None if child.bias is None else child.bias.detach().clone()
            setattr(parent, name, QuantLinear(child.in_features, [table], bias))
            if tied and child is model.lm_head:
                model.embed_tokens = QuantEmbedding(table)
            count += 1
    logger.info("quantized %d linear layers to %s", count, kind)
    install_one_call_decode(model)
    return count
