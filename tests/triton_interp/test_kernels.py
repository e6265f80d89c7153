"""Each Triton kernel against a float64 reference, under the interpreter: head counts, GQA ratios (1, 3, 4,
all heads on one KV head), head sizes (32 to 128, 80 padded), block sizes (1 to 256), context lengths
(0 for a padding row, 1, a block, a block + 1, many blocks) and split counts (1, a non-power of two, more
splits than tiles).

The cache starts full of NaN and only the context's slots are written: a kernel that reads one slot past
a context, or a padded block-table entry, returns NaN. Sizes are small: the interpreter is slow."""

from __future__ import annotations

import pytest
import torch

from argosy.engine.triton_ops.decode_attention import num_splits_for, paged_decode_attention
from argosy.engine.triton_ops.kv_write import write_kv
from argosy.engine.triton_ops.norm_rope import add_rms_norm, rms_norm, rope_
from argosy.engine.triton_ops.prefill_attention import paged_prefill_attention
from tests.triton_interp import references as ref

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def paged_cache(lengths: list[int], kv_heads: int, dim: int, block_size: int, dtype: torch.dtype, seed: int):
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
        slots = ref.slots_of(own, n, block_size)
        flat = kv.view(2, -1, kv_heads, dim)
        flat[:, slots] = torch.randn(2, n, kv_heads, dim, generator=gen).to(dtype)
    return kv, torch.tensor(tables, dtype=torch.long)


DECODE_CASES = [  # heads, kv_heads, head_dim, block_size, splits, dtype
    (4, 4, 32, 16, 1, torch.float32),
    (8, 2, 64, 16, 4, torch.float32),
    (4, 1, 64, 1, 3, torch.float32),
    (6, 2, 80, 32, 2, torch.float32),
    (4, 2, 128, 256, 8, torch.float32),
    (8, 2, 64, 16, 16, torch.bfloat16),
]


@pytest.mark.parametrize("heads,kv_heads,dim,block_size,splits,dtype", DECODE_CASES)
def test_decode_attention_matches_the_reference(heads, kv_heads, dim, block_size, splits, dtype):
    many = 3 * block_size + 5 if block_size > 1 else 70
    lengths = [0, 1, block_size, block_size + 1, many]
    kv, tables = paged_cache(lengths, kv_heads, dim, block_size, dtype, seed=heads * dim + block_size)
    q = torch.randn(len(lengths), heads, dim, generator=torch.Generator().manual_seed(1)).to(dtype)
    scale = dim ** -0.5
    out = paged_decode_attention(q, kv, tables, torch.tensor(lengths), scale, num_splits=splits)
    assert out.dtype == dtype and out.shape == q.shape
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # a padding row (no context) gives 0, not NaN
    for i, n in enumerate(lengths[1:], start=1):
        keys, values = ref.cached(kv, ref.slots_of(tables[i], n, block_size))
        expected = ref.attention(q[i:i + 1], keys, values, [n - 1], scale)
        torch.testing.assert_close(out[i:i + 1].double(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_split_counts_follow_the_batch_and_stay_in_bounds():
    assert num_splits_for(1, 8) == 16  # one stream: every split the partial buffers allow
    assert num_splits_for(256, 8) == 1  # a full batch already fills the GPU
    assert all(1 <= num_splits_for(n, kv) <= 16 for n in (1, 3, 64, 1000) for kv in (1, 8))
    assert num_splits_for(16, 8) < num_splits_for(1, 8)


PREFILL_CASES = [  # heads, kv_heads, head_dim, block_size, dtype
    (4, 4, 32, 16, torch.float32),
    (8, 2, 64, 1, torch.float32),
    (6, 2, 80, 32, torch.float32),
    (4, 1, 64, 16, torch.bfloat16),
]
# (tokens cached before, chunk length): a one-token prompt, a one-block prompt, a prompt over two query
# tiles, a prefix-cache hit (a block + 1 cached), a later chunk of a chunked prefill.
CHUNKS = [(0, 1), (0, 16), (0, 40), (17, 5), (35, 37)]


@pytest.mark.parametrize("heads,kv_heads,dim,block_size,dtype", PREFILL_CASES)
def test_prefill_attention_over_chunks_matches_the_reference(heads, kv_heads, dim, block_size, dtype):
    context = [before + n for before, n in CHUNKS]
    kv, tables = paged_cache(context, kv_heads, dim, block_size, dtype, seed=heads + dim + block_size)
    starts, total = [], 3  # three rows before the chunks: a step's decodes, left alone by this launch
    for _, n in CHUNKS:
        starts.append(total)
        total += n
    q = torch.randn(total, heads, dim, generator=torch.Generator().manual_seed(2)).to(dtype)
    out = torch.full_like(q, 7.0)
    lens = torch.tensor([n for _, n in CHUNKS])
    paged_prefill_attention(q, kv, tables, torch.tensor(starts), lens, torch.tensor(context), int(lens.max()),
                            dim ** -0.5, out=out)
    assert torch.equal(out[:3], torch.full_like(out[:3], 7.0))
    for c, (before, n) in enumerate(CHUNKS):
        keys, values = ref.cached(kv, ref.slots_of(tables[c], before + n, block_size))
        rows = slice(starts[c], starts[c] + n)
        expected = ref.attention(q[rows], keys, values, list(range(before, before + n)), dim ** -0.5)
        torch.testing.assert_close(out[rows].double(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_write_puts_each_token_in_its_slot_and_skips_padding(dtype):
    kv_heads, dim, block_size, t = 2, 48, 4, 6
    kv = torch.full((2, 5, block_size, kv_heads, dim), float("nan"), dtype=dtype)
    qkv = torch.randn(t, (4 + 2 * kv_heads) * dim).to(dtype)  # k and v as the model has them: views into qkv
    k = qkv[:, 4 * dim:(4 + kv_heads) * dim].view(t, kv_heads, dim)
    v = qkv[:, (4 + kv_heads) * dim:].view(t, kv_heads, dim)
    slots = torch.tensor([13, 0, -1, 7, 19, 4])
    write_kv(kv, k, v, slots)
    flat = kv.view(2, -1, kv_heads, dim)
    written = [i for i, s in enumerate(slots.tolist()) if s >= 0]
    assert torch.equal(flat[0, slots[written]], k[written]) and torch.equal(flat[1, slots[written]], v[written])
    untouched = [s for s in range(flat.shape[1]) if s not in slots.tolist()]
    assert flat[:, untouched].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [48, 64])
def test_rms_norm_and_the_fused_residual_add_match_the_reference(dtype, dim):
    gen = torch.Generator().manual_seed(dim)
    x, residual = (torch.randn(5, dim, generator=gen) * 3).to(dtype), torch.randn(5, dim, generator=gen).to(dtype)
    weight = torch.randn(dim, generator=gen).to(dtype)
    tol = TOLERANCE[dtype] * 3
    torch.testing.assert_close(rms_norm(x, weight, 1e-6).double(), ref.rms_norm(x, weight, 1e-6), atol=tol, rtol=tol)
    summed, normed = add_rms_norm(x, residual, weight, 1e-6)
    if dtype == torch.float32:
        assert torch.equal(summed, x + residual)  # the residual stream is exactly what PyTorch's add leaves
    else:  # the interpreter's float32 -> bfloat16 truncates where the GPU (and PyTorch) round: 1 unit apart
        torch.testing.assert_close(summed, x + residual, atol=0, rtol=2 ** -7)
    torch.testing.assert_close(normed.double(), ref.rms_norm(x + residual, weight, 1e-6), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_rotates_q_and_k_in_place_and_leaves_v(dtype):
    t, heads, kv_heads, dim = 5, 4, 2, 32
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    before = qkv.clone()
    angles = torch.arange(t).unsqueeze(-1).float() * (1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim))
    cos, sin = angles.cos().to(dtype).unsqueeze(1), angles.sin().to(dtype).unsqueeze(1)
    rope_(qkv, cos, sin, heads + kv_heads, dim)
    rotated = (heads + kv_heads) * dim
    expected = ref.rope(before[:, :rotated].view(t, heads + kv_heads, dim), cos, sin)
    tol = TOLERANCE[dtype] * 3
    torch.testing.assert_close(qkv[:, :rotated].view(t, -1, dim).double(), expected, atol=tol, rtol=tol)
    assert torch.equal(qkv[:, rotated:], before[:, rotated:])
