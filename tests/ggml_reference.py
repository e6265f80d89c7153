"""llama.cpp's activation quantization and quantized dot products, in plain PyTorch (the tests' reference).

ggml's CPU backend quantizes the activation row of a product with Q4_0/Q8_0 weights to Q8_0 blocks, with
Q4_1 weights to Q8_1 blocks, and with K-quant weights to Q8_K blocks, then takes integer dot products.
On x86 with AVX/AVX2 (ggml-cpu/arch/x86/quants.c, quantize_row_q8_0 and quantize_row_q8_1) a block of
32 is quantized as:  amax = max |x|,  d = amax / 127,  id = 127 / amax (0 when amax is 0),
q = round-half-to-even(x * id) (_mm256_round_ps), d stored as float16 (round to nearest even); Q8_1
also stores s = float16(d * sum(q)), d unrounded. (ggml's portable reference, quantize_row_q8_0_ref,
uses id = 1 / d and roundf, half away from zero: a few values per million differ; x86 runs the above.)
Q8_K (quantize_row_q8_K_ref, used on x86 too): per 256, max = the value of largest magnitude,
iscale = -127 / max, q = min(127, round-half-to-even(iscale * x)), d = 1 / iscale in float32.

Every step here is one IEEE float32 operation, as in the C code, so the blocks come out bit for bit.
"""

from __future__ import annotations

import torch


def _div(a, b) -> torch.Tensor:
    """a / b, one correctly rounded float32 division (torch turns `scalar / tensor` into a reciprocal
    and a product, which differs in the last bit)."""
    a, b = torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32)
    return torch.div(*torch.broadcast_tensors(a, b))


def quantize_q8_0(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, cols] float32 -> (q int8 [rows, cols], d float16 [rows, cols / 32])."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1)
    d = _div(amax, 127.0)
    inv = torch.where(amax != 0, _div(127.0, torch.where(amax != 0, amax, 1.0)), 0.0)
    q = torch.round(blocks * inv.unsqueeze(-1))  # torch.round: half to even, as _mm256_round_ps
    return q.to(torch.int8).reshape(x.shape), d.half()


def quantize_q8_1(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [rows, cols] -> (q int8, d float16, s float16 = d * sum(q) per block of 32)."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1)
    d = _div(amax, 127.0)
    inv = torch.where(amax != 0, _div(127.0, torch.where(amax != 0, amax, 1.0)), 0.0)
    q = torch.round(blocks * inv.unsqueeze(-1))
    s = d * q.sum(-1)  # an exact integer sum, then one float32 product
    return q.to(torch.int8).reshape(x.shape), d.half(), s.half()


def quantize_q8_k(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, cols] -> (q int8, d float32 [rows, cols / 256])."""
    blocks = x.float().reshape(x.shape[0], -1, 256)
    idx = blocks.abs().argmax(-1, keepdim=True)  # the first of equal magnitudes, as the C loop's `>`
    peak = blocks.gather(-1, idx).squeeze(-1)
    safe = torch.where(peak != 0, peak, 1.0)
    iscale = torch.where(peak != 0, _div(-127.0, safe), 0.0)
    q = torch.round(blocks * iscale.unsqueeze(-1)).clamp(max=127)
    d = torch.where(peak != 0, _div(1.0, torch.where(peak != 0, iscale, 1.0)), 0.0)
    return q.to(torch.int8).reshape(x.shape), d


def _weight_blocks(qtype: int, raw: torch.Tensor, cols: int):
    """Q8_0/Q4_0/Q4_1 rows -> (integer values [rows, cols] as float, d [rows, nb], m [rows, nb] or None)."""
    rows, nb = raw.shape[0], cols // 32
    per = raw.reshape(rows, nb, -1)
    d = per[..., 0:2].contiguous().view(torch.float16).float().squeeze(-1)
    if qtype == 8:
        return per[..., 2:].contiguous().view(torch.int8).float().reshape(rows, cols), d, None
    qs = per[..., 4:] if qtype == 3 else per[..., 2:]
    vals = torch.cat([qs & 0x0F, qs >> 4], dim=-1).float()
    if qtype == 2:
        return (vals - 8).reshape(rows, cols), d, None
    m = per[..., 2:4].contiguous().view(torch.float16).float().squeeze(-1)
    return vals.reshape(rows, cols), d, m


def dot_products(qtype: int, raw: torch.Tensor, cols: int, x: torch.Tensor) -> torch.Tensor:
    """x [T, cols] times W^T for W of Q8_0/Q4_0/Q4_1 rows `raw` [out, row bytes], as ggml computes it:
    sum over blocks of d_w d_x (q_w . q_x) (+ m_w s_x for Q4_1), in float64 (the sum's order is ggml's
    own; the products of each block are exact)."""
    vals, dw, mw = _weight_blocks(qtype, raw, cols)
    nb = cols // 32
    if qtype == 3:
        qx, dx, sx = quantize_q8_1(x)
    else:
        qx, dx = quantize_q8_0(x)
    qx = qx.float().reshape(-1, nb, 32)
    out = []
    for start in range(0, vals.shape[0], 2048):  # block sums exact in float32 (|sum| < 2^24)
        part = vals[start:start + 2048].reshape(-1, nb, 32)
        isum = torch.einsum("tbk,obk->tob", qx, part).double()
        y = (isum * (dw[start:start + 2048].double().unsqueeze(0) * dx.double().unsqueeze(1))).sum(-1)
        if mw is not None:
            y = y + sx.double() @ mw[start:start + 2048].double().T
        out.append(y)
    return torch.cat(out, -1)
