"""RMS norm (optionally with the residual add fused in) and RoPE, as the model computes them in PyTorch:
the norm in float32, its result rounded to the model's dtype before the weight multiplies it (as
transformers does); the residual sum rounded to the model's dtype, as a PyTorch add would leave it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from argosy.engine.triton_ops import Launch, next_pow2


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, stride_x, stride_r, stride_o, stride_ro,
    n_cols, eps, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
        summed = (x + r).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_ro + cols, summed, mask=ok)
        x = summed.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / n_cols + eps)
    w = tl.load(weight_ptr + cols, mask=ok, other=0.0)
    normed = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (normed * w.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=ok)

@triton.jit
def _rope_kernel(
    x_ptr, cos_ptr, sin_ptr, stride_xt, stride_ct, num_rot_heads,
    HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr, HALF_PAD: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.arange(0, HEADS_PAD)
    j = tl.arange(0, HALF_PAD)
    half: tl.constexpr = HEAD_DIM // 2
    j_ok = j < half
    mask = (h < num_rot_heads)[:, None] & j_ok[None, :]
    c = tl.load(cos_ptr + t * stride_ct + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + t * stride_ct + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    first = x_ptr + t * stride_xt + h[:, None] * HEAD_DIM + j[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + half, mask=mask, other=0.0).to(tl.float32)
    tl.store(first, (x1 * c - x2 * s).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(first + half, (x2 * c + x1 * s).to(x_ptr.dtype.element_ty), mask=mask)


def rms_norm_launch(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor,
                    residual: torch.Tensor | None = None, residual_out: torch.Tensor | None = None) -> Launch:
    rows, cols = x.shape
    assert x.stride(1) == 1 and out.stride(1) == 1 and weight.is_contiguous()
    has_residual = residual is not None
    r = residual if has_residual else x
    ro = residual_out if has_residual else out
    block = next_pow2(cols)
    return Launch(_rms_norm_kernel, (rows,),
                  (x, r, weight, out, ro, x.stride(0), r.stride(0), out.stride(0), ro.stride(0), cols, eps),
                  dict(BLOCK=block, HAS_RESIDUAL=has_residual), num_warps=min(16, max(1, block // 256)))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [rows, dim] -> weight * x / sqrt(mean(x^2) + eps), in x's dtype."""
    out = torch.empty_like(x)
    rms_norm_launch(x, weight, eps, out).run()
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, rms_norm(x + residual)) in one pass over the rows."""
    out, summed = torch.empty_like(x), torch.empty_like(x)
    rms_norm_launch(x, weight, eps, out, residual, summed).run()
    return summed, out


def rope_launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, head_dim: int) -> Launch:
    """Rotates in place the first `heads` heads of each row of x [rows, width] (rotate-half layout);
    cos, sin [rows, 1, head_dim / 2]."""
    assert x.stride(1) == 1 and cos.is_contiguous() and sin.is_contiguous() and heads * head_dim <= x.shape[1]
    return Launch(_rope_kernel, (x.shape[0],),
                  (x, cos, sin, x.stride(0), cos.shape[-1], heads),
                  dict(HEAD_DIM=head_dim, HEADS_PAD=next_pow2(heads), HALF_PAD=next_pow2(head_dim // 2)),
                  num_warps=4)


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, head_dim: int) -> None:
    rope_launch(x, cos, sin, heads, head_dim).run()
