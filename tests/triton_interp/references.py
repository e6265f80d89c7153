"""float64 references for the Triton kernels, written from the definitions (not from the model's code)."""

from __future__ import annotations

import torch


def slots_of(table: list[int] | torch.Tensor, length: int, block_size: int) -> list[int]:
    return [int(table[t // block_size]) * block_size + t % block_size for t in range(length)]


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: list[int], scale: float
              ) -> torch.Tensor:
    """q [n, heads, dim] at the given positions; keys, values [ctx, kv_heads, dim] at positions 0..ctx-1.
    Each query sees keys at positions up to its own. -> [n, heads, dim] float64."""
    heads, kv_heads = q.shape[1], keys.shape[1]
    k = keys.double().repeat_interleave(heads // kv_heads, 1)
    v = values.double().repeat_interleave(heads // kv_heads, 1)
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i, pos in enumerate(positions):
        s = torch.einsum("hd,thd->ht", q[i].double(), k[:pos + 1]) * scale
        out[i] = torch.einsum("ht,thd->hd", s.softmax(-1), v[:pos + 1])
    return out


def cached(kv_cache: torch.Tensor, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V at these slots of kv_cache [2, blocks, block_size, kv_heads, dim]."""
    flat = kv_cache.reshape(2, -1, kv_cache.shape[3], kv_cache.shape[4])
    return flat[0, slots], flat[1, slots]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return weight.double() * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, dim] rotate-half layout; cos, sin [T, 1, dim / 2]."""
    x1, x2 = x.double().chunk(2, dim=-1)
    c, s = cos.double(), sin.double()
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
