"""Opt-in (`compile_matvec`): a step of one token on the CPU through an Inductor-compiled product.

A step with a single token (one sequence decoding) reads every weight once for one row, so it is bound
by memory bandwidth. By default such a step goes through the C kernel of cpu_kernels.py (csrc/matvec.c);
this is the alternative Inductor writes for the same row reduction over the [out, in] weight. In one
process, alternating runs of bench/single_stream.py's model, the two took 15.6 and 15.5 ms a token
(best of 10 each, 2026-12-03); MKL's matrix-vector product behind F.linear streams about half as fast.
Compiling costs seconds to tens of seconds per weight shape the first time (Inductor keeps its kernels
on disk for the next start), so it is off. Steps of more than one token keep the layer's own forward.
Where compiling fails (no C++ compiler, say), the engine logs it and runs without.
"""

from __future__ import annotations

import logging
from functools import partial

import torch
import torch._inductor
import torch.fx
from torch import nn

logger = logging.getLogger(__name__)


def _row_dot(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (weight * x).sum(-1)  # [out, in] * [in] -> [out]: one pass over the weight, rows in parallel


def _forward(module: nn.Linear, kernel, dense, x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 2 and x.shape[0] == 1:
        y = kernel(module.weight, x[0]).unsqueeze(0)
        return y if module.bias is None else y + module.bias
    return dense(x)  # the layer's forward from before: F.linear or oneDNN


def enable_compiled_matvec(model: nn.Module) -> bool:
    """Routes one-row calls of every Linear through the compiled kernel, compiled here for each weight
    shape; False (and the model unchanged) where compiling fails. Weights must be [out, in] contiguous."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    kernels = {}
    try:
        with torch.inference_mode():
            for one in {tuple(m.weight.shape): m for m in linears}.values():  # one Linear per weight shape
                w = one.weight
                x = torch.ones(w.shape[1], dtype=w.dtype, device=w.device)
                # Inductor straight from an FX graph, not through torch.compile: a call then skips
                # Dynamo's guard checks, 15 against 41 us a call here (a tenth of a single-stream step).
                kernels[tuple(w.shape)] = kernel = torch._inductor.compile(torch.fx.symbolic_trace(_row_dot), [w, x])
                if not torch.allclose(kernel(w, x), w.sum(-1), rtol=1e-3, atol=1e-3):
                    raise RuntimeError(f"the compiled kernel disagrees with F.linear on {tuple(w.shape)}")
    except Exception as e:  # noqa: BLE001 - any compile failure means: run without it
        logger.warning("compile_matvec: compiling the matrix-vector kernel failed (%s); running without it", e)
        return False
    for m in linears:
        m.forward = partial(_forward, m, kernels[tuple(m.weight.shape)], m.forward)
    return True
