"""On the CPU, the model's Linear layers run on oneDNN, and single rows on the C matrix-vector kernel.

PyTorch's F.linear on float32 CPU tensors goes to MKL's sgemm. Measured 2026-12-03 on our 2-core
test machine (AMD EPYC, AVX-512): bench/engine_throughput.py's 256 requests spent 15.0-15.5 s in the
layers' matmuls on oneDNN against 19.7-20.4 s with F.linear (one run each, same process setup). The
op is the one Inductor emits for CPU linears (torch.ops.mkldnn._linear_pointwise); it is checked
against F.linear once per dtype at start, and where it is missing or disagrees the layers keep
F.linear. A single row (one sequence decoding) is bound by reading the weights; it goes to
csrc/matvec.c where the CPU kernels could be built (cpu_kernels.py).

oneDNN compiles and caches one kernel per distinct shape (up to 1,024 of them, ~130 KiB each here), so
row counts are rounded up (padded_rows): unrounded, a replica under varied traffic kept meeting new row
counts, and its memory grew for as long as it ran (the soak in RELIABILITY.md).
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from torch import nn

from argosy.engine import cpu_kernels

logger = logging.getLogger(__name__)


def padded_rows(rows: int) -> int:
    """rows rounded up to one of 16 steps per power of two: exact up to 16, at most 1/16 more above."""
    if rows <= 16:
        return rows
    step = 1 << (rows.bit_length() - 5)
    return -(-rows // step) * step


def pad_rows(t: torch.Tensor) -> torch.Tensor:
    """t with zero rows appended up to padded_rows (t itself where it is already there)."""
    missing = padded_rows(t.shape[0]) - t.shape[0]
    return F.pad(t, (0, 0, 0, missing)) if missing else t


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(pad_rows(x), weight, bias, "none", [], "")[: x.shape[0]]


@functools.cache
def onednn_linear_works(dtype: torch.dtype) -> bool:
    """True where oneDNN's linear runs on this build and CPU and matches F.linear in this dtype."""
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(5, 96, generator=g).to(dtype)
        w, b = torch.randn(40, 96, generator=g).to(dtype), torch.randn(40, generator=g).to(dtype)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        for rows in (x, x[:1]):  # a batch and a single row take different kernels
            if not torch.allclose(onednn_linear(rows, w, b).float(), F.linear(rows, w, b).float(), rtol=tol, atol=tol):
                raise RuntimeError("its output differs from F.linear")
    except Exception as e:  # noqa: BLE001 - any failure means: keep F.linear
        logger.warning("oneDNN linear unavailable for %s (%s); using F.linear", dtype, e)
        return False
    return True


def _forward(module: nn.Linear, onednn: bool, matvec: bool, x: torch.Tensor) -> torch.Tensor:
    if matvec and x.dim() == 2 and x.shape[0] == 1:
        y = cpu_kernels.matvec(module.weight, x)
        return y if module.bias is None else y + module.bias
    if onednn and x.dim() == 2:
        return onednn_linear(x, module.weight, module.bias)
    return F.linear(x, module.weight, module.bias)


def route_cpu_linears(model: nn.Module) -> bool:
    """Routes every Linear of a CPU model as above (weights stay [out, in] contiguous); False, and the
    model unchanged, where neither oneDNN nor the C kernels can run."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears or linears[0].weight.device.type != "cpu":
        return False
    dtype = linears[0].weight.dtype
    onednn = onednn_linear_works(dtype)
    contiguous = all(m.weight.is_contiguous() and m.weight.dtype == torch.float32 for m in linears)
    matvec = contiguous and cpu_kernels.available()
    if not (onednn or matvec):
        return False
    for m in linears:
        m.forward = functools.partial(_forward, m, onednn, matvec)
    return True
