"""The Triton kernels (engine/triton_ops/) without a GPU: under Triton's interpreter against float64
references, the whole engine on them against the plain path (tests/triton_interp/, in a process of its
own: the interpreter is chosen when triton is first imported), and each kernel compiled ahead of time for
the H200 (sm_90), which catches what the interpreter lets through (shapes tl.dot refuses, types)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.fleet_fixtures import ROOT

pytest.importorskip("triton", reason="triton is not installed (pip install 'argosy[gpu]'; .ci/run installs it)")


def test_kernels_and_the_engine_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/triton_interp"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert " passed" in out.stdout.splitlines()[-1] and "skipped" not in out.stdout.splitlines()[-1]


def llama_8b_launches(dtype: torch.dtype) -> list:
    """Every launch the engine makes on CUDA, with Llama-3.1-8B's shapes (32 heads, 8 KV heads, head size
    128, hidden 4096) and blocks of 16: tiny tensors, since only their types and strides matter here."""
    from argosy.engine.triton_ops.decode_attention import decode_launches
    from argosy.engine.triton_ops.kv_write import write_kv_launch
    from argosy.engine.triton_ops.norm_rope import rms_norm_launch, rope_launch
    from argosy.engine.triton_ops.prefill_attention import prefill_launch

    t, heads, kv_heads, dim = 4, 32, 8, 128
    qkv = torch.empty(t, (heads + 2 * kv_heads) * dim, dtype=dtype)
    q = qkv[:, :heads * dim].view(t, heads, dim)
    k = qkv[:, heads * dim:(heads + kv_heads) * dim].view(t, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim:].view(t, kv_heads, dim)
    kv_cache = torch.empty(2, 3, 16, kv_heads, dim, dtype=dtype)
    table, lens = torch.zeros(t, 2, dtype=torch.long), torch.ones(t, dtype=torch.long)
    out = torch.empty(t, heads, dim, dtype=dtype)
    x, weight = torch.empty(t, 4096, dtype=dtype), torch.empty(4096, dtype=dtype)
    cos = torch.empty(t, 1, dim // 2, dtype=dtype)
    return [*decode_launches(q, kv_cache, table, lens, 0.1, out, num_splits=16),
            *decode_launches(q, kv_cache, table, lens, 0.1, out, num_splits=1),
            prefill_launch(q, kv_cache, table, lens, lens, lens, 4, 0.1, out),
            write_kv_launch(kv_cache, k, v, lens),
            rms_norm_launch(x, weight, 1e-5, x), rms_norm_launch(x, weight, 1e-5, x, x, x),
            rope_launch(qkv, cos, cos, heads + kv_heads, dim)]


def test_every_kernel_compiles_for_the_h200():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process: kernels are not compiled")
    names = []
    for launch in llama_8b_launches(torch.bfloat16):
        compiled = launch.compile_for(90)
        assert compiled.asm["cubin"], launch.kernel
        names.append(launch.kernel.fn.__name__)
    assert {"_decode_split_kernel", "_decode_reduce_kernel", "_prefill_kernel", "_write_kv_kernel",
            "_rms_norm_kernel", "_rope_kernel"} <= set(names)
    # float32 takes the IEEE path of tl.dot (TF32 would keep 10 bits of each operand's mantissa)
    assert "tf32" not in llama_8b_launches(torch.float32)[0].compile_for(90).asm["ptx"]
