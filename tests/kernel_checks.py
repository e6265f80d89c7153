"""The Triton kernels' checks, on any device: under the interpreter on the CPU (tests/triton_interp/) and
compiled on a GPU (tests/test_gpu.py). Each runs a kernel and compares it with a float64 reference
written from the definitions (not from the model's code).

The cache starts full of NaN and only the context's slots are written: a kernel that reads one slot past
a context, or a padded block-table entry, returns NaN."""

from __future__ import annotations

import torch

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}


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


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return weight.double() * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, dim] rotate-half layout; cos, sin [T, 1, dim / 2]."""
    x1, x2 = x.double().chunk(2, dim=-1)
    c, s = cos.double(), sin.double()
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def paged_cache(lengths: list[int], kv_heads: int, dim: int, block_size: int, dtype: torch.dtype, seed: int,
                device: str = "cpu"):
    """A NaN cache holding random K/V for sequences of these lengths in shuffled blocks; each one's
    block table (padded with the id of a block no sequence owns, whose slots stay NaN)."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in lengths]
    num_blocks = sum(need) + 1
    kv = torch.full((2, num_blocks, block_size, kv_heads, dim), float("nan"), dtype=dtype)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    poison, order = order[0], order[1:]
    width = max(need) + 1
    tables, taken = [], 0
    for n, b in zip(lengths, need, strict=True):
        own = order[taken:taken + b]
        taken += b
        tables.append(own + [poison] * (width - b))
        slots = slots_of(own, n, block_size)
        flat = kv.view(2, -1, kv_heads, dim)
        flat[:, slots] = torch.randn(2, n, kv_heads, dim, generator=gen).to(dtype)
    return kv.to(device), torch.tensor(tables, dtype=torch.long, device=device)


def check_decode(device: str, heads: int, kv_heads: int, dim: int, block_size: int, splits: int,
                 dtype: torch.dtype) -> None:
    from argosy.engine.triton_ops.decode_attention import paged_decode_attention

    many = 3 * block_size + 5 if block_size > 1 else 70
    lengths = [0, 1, block_size, block_size + 1, many]
    kv, tables = paged_cache(lengths, kv_heads, dim, block_size, dtype, heads * dim + block_size, device)
    q = torch.randn(len(lengths), heads, dim, generator=torch.Generator().manual_seed(1)).to(dtype).to(device)
    scale = dim ** -0.5
    out = paged_decode_attention(q, kv, tables, torch.tensor(lengths, device=device), scale, num_splits=splits)
    assert out.dtype == dtype and out.shape == q.shape
    out, q, kv, tables = out.cpu(), q.cpu(), kv.cpu(), tables.cpu()
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # a padding row (no context) gives 0, not NaN
    for i, n in enumerate(lengths[1:], start=1):
        keys, values = cached(kv, slots_of(tables[i], n, block_size))
        expected = attention(q[i:i + 1], keys, values, [n - 1], scale)
        torch.testing.assert_close(out[i:i + 1].double(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


# (tokens cached before, chunk length): a one-token prompt, a one-block prompt, a prompt over two query
# tiles, a prefix-cache hit (a block + 1 cached), a later chunk of a chunked prefill.
CHUNKS = [(0, 1), (0, 16), (0, 40), (17, 5), (35, 37)]


def check_prefill(device: str, heads: int, kv_heads: int, dim: int, block_size: int, dtype: torch.dtype) -> None:
    from argosy.engine.triton_ops.prefill_attention import paged_prefill_attention

    context = [before + n for before, n in CHUNKS]
    kv, tables = paged_cache(context, kv_heads, dim, block_size, dtype, heads + dim + block_size, device)
    starts, total = [], 3  # three rows before the chunks: a step's decodes, left alone by this launch
    for _, n in CHUNKS:
        starts.append(total)
        total += n
    q = torch.randn(total, heads, dim, generator=torch.Generator().manual_seed(2)).to(dtype).to(device)
    out = torch.full_like(q, 7.0)
    lens = torch.tensor([n for _, n in CHUNKS], device=device)
    paged_prefill_attention(q, kv, tables, torch.tensor(starts, device=device), lens,
                            torch.tensor(context, device=device), int(lens.max()), dim ** -0.5, out=out)
    out, q, kv, tables = out.cpu(), q.cpu(), kv.cpu(), tables.cpu()
    assert torch.equal(out[:3], torch.full_like(out[:3], 7.0))
    for c, (before, n) in enumerate(CHUNKS):
        keys, values = cached(kv, slots_of(tables[c], before + n, block_size))
        rows = slice(starts[c], starts[c] + n)
        expected = attention(q[rows], keys, values, list(range(before, before + n)), dim ** -0.5)
        torch.testing.assert_close(out[rows].double(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def check_kv_write(device: str, dtype: torch.dtype) -> None:
    from argosy.engine.triton_ops.kv_write import write_kv

    kv_heads, dim, block_size, t = 2, 48, 4, 6
    kv = torch.full((2, 5, block_size, kv_heads, dim), float("nan"), dtype=dtype, device=device)
    qkv = torch.randn(t, (4 + 2 * kv_heads) * dim).to(dtype).to(device)  # k and v as the model has them: views
    k = qkv[:, 4 * dim:(4 + kv_heads) * dim].view(t, kv_heads, dim)
    v = qkv[:, (4 + kv_heads) * dim:].view(t, kv_heads, dim)
    slots = torch.tensor([13, 0, -1, 7, 19, 4], device=device)
    write_kv(kv, k, v, slots)
    flat, slots, k, v = kv.view(2, -1, kv_heads, dim).cpu(), slots.cpu(), k.cpu(), v.cpu()
    written = [i for i, s in enumerate(slots.tolist()) if s >= 0]
    assert torch.equal(flat[0, slots[written]], k[written]) and torch.equal(flat[1, slots[written]], v[written])
    untouched = [s for s in range(flat.shape[1]) if s not in slots.tolist()]
    assert flat[:, untouched].isnan().all()


def check_rms_norm(device: str, dtype: torch.dtype, dim: int, exact_sum: bool) -> None:
    """exact_sum: the fused add must equal PyTorch's add bit for bit (on a GPU; the interpreter truncates
    float32 to bfloat16 where the GPU rounds, so there it may be one unit apart)."""
    from argosy.engine.triton_ops.norm_rope import add_rms_norm, rms_norm

    gen = torch.Generator().manual_seed(dim)
    x = (torch.randn(5, dim, generator=gen) * 3).to(dtype).to(device)
    residual = torch.randn(5, dim, generator=gen).to(dtype).to(device)
    weight = torch.randn(dim, generator=gen).to(dtype).to(device)
    tol = TOLERANCE[dtype] * 3
    got = rms_norm(x, weight, 1e-6).cpu().double()
    torch.testing.assert_close(got, rms_norm_reference(x.cpu(), weight.cpu(), 1e-6), atol=tol, rtol=tol)
    summed, normed = add_rms_norm(x, residual, weight, 1e-6)
    if exact_sum:
        assert torch.equal(summed, x + residual)  # the residual stream is exactly what PyTorch's add leaves
    else:
        torch.testing.assert_close(summed, x + residual, atol=0, rtol=2 ** -7)
    expected = rms_norm_reference((x + residual).cpu(), weight.cpu(), 1e-6)
    torch.testing.assert_close(normed.cpu().double(), expected, atol=tol, rtol=tol)


def check_rope(device: str, dtype: torch.dtype) -> None:
    from argosy.engine.triton_ops.norm_rope import rope_

    t, heads, kv_heads, dim = 5, 4, 2, 32
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    before = qkv.clone()
    angles = torch.arange(t).unsqueeze(-1).float() * (1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim))
    cos, sin = angles.cos().to(dtype).unsqueeze(1), angles.sin().to(dtype).unsqueeze(1)
    qkv = qkv.to(device)
    rope_(qkv, cos.to(device), sin.to(device), heads + kv_heads, dim)
    qkv = qkv.cpu()
    rotated = (heads + kv_heads) * dim
    expected = rope_reference(before[:, :rotated].view(t, heads + kv_heads, dim), cos, sin)
    tol = TOLERANCE[dtype] * 3
    torch.testing.assert_close(qkv[:, :rotated].view(t, -1, dim).double(), expected, atol=tol, rtol=tol)
    assert torch.equal(qkv[:, rotated:], before[:, rotated:])
