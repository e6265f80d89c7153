"""CPU: each BERT layer's matrix products on oneDNN, with GELU and the residual adds fused into them.

The ops are those Inductor emits for CPU linears (torch.ops.mkldnn._linear_pointwise, and its binary
form for `linear(x) + residual`): the activation and the add happen while the product's output is in
cache, instead of as two more passes over [tokens, 1536] and [tokens, 384] tensors. Each is checked
against plain PyTorch once per dtype and activation; where one is missing or disagrees, the layers keep
plain PyTorch (which also runs everywhere else: CUDA, other builds).
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

from argosy.engine.cpu_linear import pad_rows

logger = logging.getLogger(__name__)

_ACT = {"gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"), "gelu_pytorch_tanh": ("gelu", "tanh"),
        "relu": ("relu", "")}
_REFERENCE = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
              "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


# Row counts are rounded as the LLM's linears round them (cpu_linear.padded_rows: bounded oneDNN kernels).
def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(pad_rows(x), w, b, "none", [], "")[: x.shape[0]]


def _linear_act(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, act: str) -> torch.Tensor:
    attr, algorithm = _ACT[act]
    return torch.ops.mkldnn._linear_pointwise(pad_rows(x), w, b, attr, [], algorithm)[: x.shape[0]]


def _linear_add(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise.binary(pad_rows(x), pad_rows(residual), w, b, "add")[: x.shape[0]]


@functools.cache
def fused_ops_work(dtype: torch.dtype, act: str) -> bool:
    """True where the fused oneDNN ops run on this build and CPU and match plain PyTorch."""
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(7, 64, generator=g).to(dtype)
        res = torch.randn(7, 48, generator=g).to(dtype)
        w, b = (torch.randn(48, 64, generator=g) / 8).to(dtype), torch.randn(48, generator=g).to(dtype)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        checks = [(_linear(x, w, b), F.linear(x, w, b)),
                  (_linear_act(x, w, b, act), _REFERENCE[act](F.linear(x, w, b))),
                  (_linear_add(x, res, w, b), F.linear(x, w, b) + res)]
        for got, want in checks:
            if not torch.allclose(got.float(), want.float(), rtol=tol, atol=tol):
                raise RuntimeError("its output differs from plain PyTorch")
    except Exception as e:  # noqa: BLE001 - any failure means: keep plain PyTorch
        logger.warning("fused oneDNN linears unavailable for %s/%s (%s); using plain PyTorch", dtype, act, e)
        return False
    return True


def fused_layer_forward(layer, x: torch.Tensor, batch) -> torch.Tensor:
    a = layer.attention(_linear(x, layer.qkv.weight, layer.qkv.bias), batch)
    x = layer.attn_norm(_linear_add(a, x, layer.attn_out.weight, layer.attn_out.bias))
    h = _linear_act(x, layer.up.weight, layer.up.bias, layer.act_name)
    return layer.out_norm(_linear_add(h, x, layer.down.weight, layer.down.bias))


def use_fused_cpu_layers(model: torch.nn.Module) -> bool:
    """Routes a CPU model's layers through fused_layer_forward; False (unchanged) where it cannot run."""
    layers = list(getattr(model, "layers", []))
    if not layers or layers[0].qkv.weight.device.type != "cpu":
        return False
    if not fused_ops_work(layers[0].qkv.weight.dtype, layers[0].act_name):
        return False
    for layer in layers:
        layer.fused = fused_layer_forward
    return True
