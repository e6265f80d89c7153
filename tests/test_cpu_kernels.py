"""The CPU fast paths: the C kernels (decode attention, one-row matvec) and oneDNN linears.

Each is used by default, gives the outputs of the plain path, and falls back to it where it can't run.
"""

import logging
import os

import pytest
import torch
import torch.nn.functional as F

from argosy import LLM, SamplingParams
from argosy.engine import cpu_kernels, cpu_linear


@pytest.fixture(scope="module")
def kernel():
    assert cpu_kernels.available(), "the CPU kernels must build on the test machine (it has a C compiler)"
    return cpu_kernels.paged_decode_attention


def assert_same_outputs(a, b, tol: float) -> None:
    """Same greedy tokens, and the sampled tokens' logprobs within tol."""
    for x, y in zip(a, b, strict=True):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        lx = [next(iter(d.values())).logprob for d in x.outputs[0].logprobs]
        ly = [next(iter(d.values())).logprob for d in y.outputs[0].logprobs]
        assert max(abs(p - q) for p, q in zip(lx, ly, strict=True)) < tol


def reference(q, kv_cache, tables, lens, scale):
    """Each sequence's K/V cut out of the cache token by token and attended with SDPA in float64."""
    _, _, bs, kv_heads, _ = kv_cache.shape
    out = torch.empty_like(q)
    for i, n in enumerate(lens.tolist()):
        slots = [tables[i, p // bs].item() * bs + p % bs for p in range(n)]
        k, v = (kv_cache[j].reshape(-1, kv_heads, q.shape[2])[slots].double().transpose(0, 1) for j in (0, 1))
        o = F.scaled_dot_product_attention(q[i].double().unsqueeze(1), k, v, scale=scale,
                                           enable_gqa=q.shape[1] != kv_heads)
        out[i] = o.squeeze(1).float()
    return out


# Head sizes 64 and 128 take the AVX-512 path (16 scores at a time; blocks of 8 and 32 cut them short or
# in two), the others the generic one.
@pytest.mark.parametrize("heads,kv_heads,dim,block_size", [(4, 4, 64, 16), (6, 2, 20, 8), (8, 1, 72, 16),
                                                          (6, 2, 64, 8), (9, 3, 128, 32)])
@pytest.mark.parametrize("n", [1, 9])  # one sequence splits its KV heads over the threads; nine do not
def test_kernel_equals_attention_over_each_sequences_blocks(kernel, heads, kv_heads, dim, block_size, n):
    g = torch.Generator().manual_seed(n * 100 + dim)
    num_blocks = 64
    kv_cache = torch.randn(2, num_blocks, block_size, kv_heads, dim, generator=g)
    lens = torch.tensor(([1, block_size, block_size + 1, 5 * block_size - 3] * 3)[:n])
    width = -(-int(lens.max()) // block_size) + 2  # wider than needed: entries past the end are never read
    tables = torch.stack([torch.randperm(num_blocks, generator=g)[:width] for _ in range(n)])
    q = torch.randn(n, heads, dim, generator=g)
    got = kernel(q, kv_cache, tables, lens, dim ** -0.5)
    torch.testing.assert_close(got, reference(q, kv_cache, tables, lens, dim ** -0.5), rtol=1e-5, atol=1e-5)


def test_a_table_shorter_than_its_context_is_refused(kernel):
    kv_cache = torch.zeros(2, 8, 16, 2, 32)
    with pytest.raises(ValueError, match="shorter than its context"):
        kernel(torch.zeros(1, 2, 32), kv_cache, torch.zeros(1, 2, dtype=torch.long), torch.tensor([33]), 1.0)


def test_the_engine_uses_the_kernel_by_default_with_the_outputs_of_gather_and_sdpa(tiny_llama):
    prompts = [list(range(3, 3 + n)) for n in (5, 20, 33, 64, 90)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1)
    fast = LLM(tiny_llama, kv_cache_memory_gib=0.02)
    assert fast.engine.runner.attention.name == "cpu_kernel"
    seen = []
    prepare = fast.engine.runner.prepare
    fast.engine.runner.prepare = lambda scheduled: seen.append(prepare(scheduled)) or seen[-1]
    plain = LLM(tiny_llama, kv_cache_memory_gib=0.02)
    plain.engine.runner.use_attention("sdpa")
    a = fast.generate(prompts, params, use_tqdm=False)
    b = plain.generate(prompts, params, use_tqdm=False)
    groups = [g for batch in seen for g in batch.meta.decode_groups]
    assert groups and all(g.context_lens is not None for g in groups)
    assert max(g.count for g in groups) == len(prompts)  # all decodes of a step in one call
    assert_same_outputs(a, b, 1e-5)


@pytest.mark.parametrize("env", [{"ARGOSY_CPU_KERNELS": "0"}, {"CC": "/bin/false"}])
def test_without_the_kernel_the_engine_logs_it_and_uses_gather_and_sdpa(tiny_llama, monkeypatch, caplog, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cpu_kernels._library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="argosy.engine.cpu_kernels"):
            llm = LLM(tiny_llama, kv_cache_memory_gib=0.02)
        assert llm.engine.runner.attention.name == "sdpa"
        assert llm.engine.runner.model.lm_head.forward.args[1:] == (True, False)  # oneDNN, no C matvec
        if "CC" in env:
            assert "CPU kernels unavailable" in caplog.text
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
        prompts = [[5, 6, 7], list(range(3, 50))]
        plain = llm.generate(prompts, params, use_tqdm=False)
    finally:
        monkeypatch.undo()
        cpu_kernels._library.cache_clear()
    default = LLM(tiny_llama, kv_cache_memory_gib=0.02)  # with every C kernel
    assert_same_outputs(default.generate(prompts, params, use_tqdm=False), plain, 1e-4)


def test_loading_the_kernel_leaves_float_behaviour_alone(kernel):
    # A library built with -ffast-math (GCC 12) would turn on flush-to-zero for the whole process.
    assert (torch.tensor([1e-39]) * 1.0).item() > 0


@pytest.mark.parametrize("out_features,in_features", [(64, 48), (7, 19), (33, 770)])
def test_matvec_kernel_equals_a_matrix_vector_product(out_features, in_features):
    matvec = cpu_kernels.matvec
    g = torch.Generator().manual_seed(out_features)
    w, x = torch.randn(out_features, in_features, generator=g), torch.randn(in_features, generator=g)
    torch.testing.assert_close(matvec(w, x[None]), (w.double() @ x.double()).float()[None], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="float32"):
        matvec(w, x[None].double())


def test_cpu_linears_run_on_onednn_and_the_c_matvec_with_the_outputs_of_f_linear(tiny_llama, monkeypatch):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=1)
    prompts = [list(range(3, 40)), [7, 8, 9]]
    fast = LLM(tiny_llama, kv_cache_memory_gib=0.02)
    layer = fast.engine.runner.model.lm_head
    assert layer.forward.func is cpu_linear._forward and layer.weight.is_contiguous()
    assert layer.forward.args[1:] == (True, True)  # oneDNN and the C matvec

    def broken(*args):
        raise RuntimeError("no oneDNN here")

    monkeypatch.setattr(cpu_linear, "onednn_linear", broken)
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    cpu_linear.onednn_linear_works.cache_clear()
    try:
        plain = LLM(tiny_llama, kv_cache_memory_gib=0.02)
    finally:
        monkeypatch.undo()
        cpu_linear.onednn_linear_works.cache_clear()
    layer = plain.engine.runner.model.lm_head
    assert not hasattr(layer.forward, "func") and not layer.weight.is_contiguous()  # F.linear on [in, out]
    one_row = [[7, 8, 9]]  # n = 1: every decode step is a single row
    for batch in (prompts, one_row):
        assert_same_outputs(fast.generate(batch, params, use_tqdm=False), plain.generate(batch, params, use_tqdm=False),
                            1e-4)


def test_a_rank_without_the_kernel_attends_the_kernels_group_with_a_mask(kernel, monkeypatch):
    # In a parallel engine the driver builds the batch; a rank that could not build the kernel gets the
    # kernel's one group (context lengths, no mask) and must attend to it all the same.
    from argosy.engine.attention import AttentionMetadata, DecodeGroup, paged_attention

    g = torch.Generator().manual_seed(3)
    kv_cache = torch.randn(2, 32, 16, 2, 32, generator=g)
    lens = torch.tensor([5, 40, 17])
    tables = torch.stack([torch.randperm(32, generator=g)[:3] for _ in range(3)])
    q = torch.randn(3, 6, 32, generator=g)
    meta = AttentionMetadata(torch.zeros(0, dtype=torch.long), [DecodeGroup(0, 3, tables, None, context_lens=lens)], [])
    k = torch.empty(3, 2, 32)
    expected = kernel(q, kv_cache, tables, lens, 0.2)
    monkeypatch.setattr(cpu_kernels, "_library", lambda: None)
    assert not cpu_kernels.available()
    torch.testing.assert_close(paged_attention(q, k, k, kv_cache, meta, 0.2), expected, rtol=1e-5, atol=1e-5)


def test_rms_norm_and_rope_kernels_equal_the_pytorch_ops():
    from argosy.engine.models.llama import RMSNorm, apply_rope

    g = torch.Generator().manual_seed(5)
    norm = RMSNorm(48, 1e-5)
    norm.weight.data = torch.randn(48, generator=g)
    x = torch.randn(7, 48, generator=g) * 3
    expected = norm(x)  # the class default: no kernel
    torch.testing.assert_close(cpu_kernels.rms_norm(x, norm.weight, 1e-5), expected, rtol=1e-5, atol=1e-6)

    heads, kv_heads, dim, rows = 4, 2, 16, 5
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=g)
    freqs = torch.arange(rows).float().unsqueeze(1) * torch.rand(dim // 2, generator=g)
    cos, sin = freqs.cos().unsqueeze(1), freqs.sin().unsqueeze(1)
    qk = qkv[:, :(heads + kv_heads) * dim].view(rows, heads + kv_heads, dim)
    expected, v = apply_rope(qk, cos, sin), qkv[:, (heads + kv_heads) * dim:].clone()
    cpu_kernels.rope_(qkv, cos, sin, heads + kv_heads, dim)
    torch.testing.assert_close(qk, expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(qkv[:, (heads + kv_heads) * dim:], v)  # v is not touched


def test_silu_mul_kernel_equals_the_pytorch_ops_over_the_whole_float_range():
    g = torch.Generator().manual_seed(6)
    gu = torch.randn(70, 2 * 1024, generator=g) * 6  # 70 rows: split over the threads
    gu[0, :8] = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 300.0, -300.0])  # exp's far ends
    gate, up = gu.split(1024, dim=-1)
    got = cpu_kernels.silu_mul(gu)
    torch.testing.assert_close(got, F.silu(gate.double()).float() * up, rtol=2e-6, atol=1e-30)
    assert torch.isfinite(got).all()


def test_write_kv_kernel_fills_the_slots_as_index_copy_does_and_refuses_a_slot_outside_the_cache():
    g = torch.Generator().manual_seed(9)
    qkv = torch.randn(4, 6 * 16, generator=g)  # 2 query heads, then k and v of 2 KV heads, dim 16
    k, v = qkv[:, 32:64].view(4, 2, 16), qkv[:, 64:].view(4, 2, 16)
    slots = torch.tensor([5, 0, 63, 17])
    got, expected = torch.zeros(2, 4, 16, 2, 16), torch.zeros(2, 4, 16, 2, 16)
    cpu_kernels.write_kv(got, k, v, slots)
    expected.view(2, -1, 2, 16)[0].index_copy_(0, slots, k)
    expected.view(2, -1, 2, 16)[1].index_copy_(0, slots, v)
    assert torch.equal(got, expected)
    with pytest.raises(IndexError, match="outside the cache"):
        cpu_kernels.write_kv(got, k, v, torch.tensor([5, 0, 64, 17]))


def test_onednn_kernels_stay_few_whatever_the_row_counts():
    """oneDNN compiles and caches a kernel per shape: 384 row counts must not mean 384 kernels (a replica's
    memory grew under varied traffic until row counts were rounded; the soak in RELIABILITY.md)."""
    if not cpu_linear.onednn_linear_works(torch.float32):
        pytest.skip("this PyTorch build has no working oneDNN linear (the layers use F.linear)")
    script = """
import torch
from torch import nn
import torch.nn.functional as F
from argosy.engine import cpu_linear
from argosy.encoder import cpu_ops
layer = nn.Linear(96, 40)
assert cpu_linear.route_cpu_linears(layer)
w, b, g = torch.randn(40, 96), torch.randn(40), torch.Generator().manual_seed(0)
for rows in range(17, 401):
    x = torch.randn(rows, 96, generator=g)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-4, atol=1e-4)
    res = torch.randn(rows, 40, generator=g)
    torch.testing.assert_close(cpu_ops._linear_add(x, res, w, b), F.linear(x, w, b) + res, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cpu_ops._linear_act(x, w, b, "gelu"), F.gelu(F.linear(x, w, b)), rtol=1e-4, atol=1e-4)
"""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, "ONEDNN_VERBOSE": "2"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    created = [line for line in out.stdout.splitlines() if "create:cache_miss,cpu,inner_product" in line]
    # rows 17..400: 16 rounded counts per power of two, fewer than 80 per kind of product (384 unrounded)
    assert 0 < len(created) <= 3 * 80, len(created)
    assert not [r for r in range(1, 2000) if not r <= cpu_linear.padded_rows(r) <= r + r // 16]
