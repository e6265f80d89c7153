"""Int8 activations as llama.cpp's (csrc/quant_int8.c, ARGOSY_INT8_ACTIVATIONS=1): the activation blocks bit
for bit as ggml's x86 code makes them (tests/ggml_reference.py), and the products against its integer sums."""

from __future__ import annotations

import pytest
import torch

gguf = pytest.importorskip("gguf")

from argosy import LLM  # noqa: E402
from argosy.engine import quant_kernels  # noqa: E402
from argosy.engine.quant_kernels import QuantTensor  # noqa: E402
from argosy.engine.quant_linear import QuantLinear  # noqa: E402
from argosy.engine.random_model import make_random_model  # noqa: E402
from tests import ggml_reference  # noqa: E402
from tests.gguf_fixtures import hf_to_gguf  # noqa: E402
from tests.test_gguf import DIMS, LONGER, PROMPTS  # noqa: E402
from tests.test_quant_kernels import random_blocks  # noqa: E402

pytestmark = pytest.mark.skipif(not quant_kernels.available(), reason="no C compiler: the kernels are not built")

@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return make_random_model(tmp_path_factory.mktemp("hf") / "llama", arch="llama", **DIMS)


FALLBACKS = {"avx2": ("-mno-avx512f", "-mno-avx512vnni"), "plain-c": ("-mno-avx2", "-mno-avx512f", "-mno-f16c")}


def activations(rows: int = 2048, cols: int = 576) -> torch.Tensor:
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows))
    x *= torch.logspace(-6, 3, rows).unsqueeze(1)  # tiny to large rows: float16 scales from subnormal up
    # (over a million values: id = 127 / amax, not ggml's portable 1 / d, changes a few per million)
    x[1, :32] = 0.0  # a block of zeros: scale 0, no division by zero
    # amax 127 makes the scale exactly 1: these land on halves, where round-half-to-even (ggml's x86
    # _mm256_round_ps) and roundf (half away from zero) differ.
    x[2, :32] = torch.tensor([127.0, 2.5, -3.5, 0.5, -0.5, 1.5, 6.5, -126.5] * 4)
    return x


def split_blocks(raw: torch.Tensor, head: int) -> tuple[torch.Tensor, ...]:
    blocks = raw.view(raw.shape[0], -1, head + 32)
    q = blocks[..., head:].contiguous().view(torch.int8).reshape(raw.shape[0], -1)
    halves = [blocks[..., i:i + 2].contiguous().view(torch.float16).squeeze(-1) for i in range(0, head, 2)]
    return q, *halves


@pytest.mark.parametrize("build", [None, *FALLBACKS], ids=["native", *FALLBACKS])
def test_activation_blocks_are_bit_exact_with_ggml(build):
    lib = None if build is None else quant_kernels.build_library(FALLBACKS[build])
    x = activations()
    q, d = split_blocks(quant_kernels.quantize_activations(x, 8, lib=lib), 2)
    ref_q, ref_d = ggml_reference.quantize_q8_0(x)
    assert torch.equal(q, ref_q) and torch.equal(d.view(torch.int16), ref_d.view(torch.int16))
    q, d, s = split_blocks(quant_kernels.quantize_activations(x, 9, lib=lib), 4)
    ref_q, ref_d, ref_s = ggml_reference.quantize_q8_1(x)
    assert torch.equal(q, ref_q) and torch.equal(d.view(torch.int16), ref_d.view(torch.int16))
    assert torch.equal(s.view(torch.int16), ref_s.view(torch.int16))
    assert q[2, :8].tolist() == [127, 2, -4, 0, 0, 2, 6, -126]  # halves to even


@pytest.mark.parametrize("build", [None, *FALLBACKS], ids=["native", *FALLBACKS])
@pytest.mark.parametrize("qtype", [8, 2, 3], ids=["Q8_0", "Q4_0", "Q4_1"])
def test_int8_products_are_ggml_integer_sums(build, qtype):
    lib = None if build is None else quant_kernels.build_library(FALLBACKS[build])
    raw = torch.from_numpy(random_blocks(qtype, 40, 576).copy())
    w, x = QuantTensor(qtype, raw, 576), activations(5)[3:]  # rows of moderate scale
    ref = ggml_reference.dot_products(qtype, raw, 576, x)
    for rows in (1, 2):
        int8 = quant_kernels.matmul(w, x[:rows].contiguous(), lib=lib, int8=True).double()
        float32 = quant_kernels.matmul(w, x[:rows].contiguous(), lib=lib, int8=False).double()
        # The same integer sums and scales; only the order of the float32 sum over blocks differs.
        assert ((int8 - ref[:rows]).norm() / ref[:rows].norm()).item() < 2e-6
        assert ((float32 - ref[:rows]).norm() / ref[:rows].norm()).item() > 1e-4  # the float path does not


def test_the_option_routes_linear_layers_and_one_token_steps(tmp_path, llama_folder, monkeypatch):
    raw = torch.from_numpy(random_blocks(3, 16, 576).copy())
    layer, x = QuantLinear(576, [QuantTensor(3, raw, 576)]), activations(3)
    assert torch.equal(layer(x), quant_kernels.matmul(layer.segments[0], x, int8=False))
    monkeypatch.setenv("ARGOSY_INT8_ACTIVATIONS", "1")
    assert torch.equal(layer(x), quant_kernels.matmul(layer.segments[0], x, int8=True))
    assert not torch.equal(layer(x), quant_kernels.matmul(layer.segments[0], x, int8=False))
    # The single-stream C path (one call per step) quantizes as the layer-by-layer path does.
    path = str(hf_to_gguf(llama_folder, tmp_path / "q41.gguf", "Q4_1", tensor_types={"blk.1.attn_v.weight": "Q8_0"}))
    with LLM(path, kv_cache_memory_gib=0.05) as llm:
        assert "forward" in vars(llm.engine.runner.model)
        fused = [llm.generate(p, LONGER, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS]
    monkeypatch.setenv("ARGOSY_QUANT_DECODE", "0")
    with LLM(path, kv_cache_memory_gib=0.05) as llm:
        layered = [llm.generate(p, LONGER, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS]
    assert fused == layered
