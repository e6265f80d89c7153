"""The quantized CPU kernels (csrc/quant_matmul.c): GGML's dequantization bit for bit, products against float64
(block types, F16 and BF16 rows kept in 2 bytes a weight, and F32 rows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from argosy.engine import quant_kernels  # noqa: E402
from argosy.engine.quant_kernels import KERNEL_TYPES, QuantTensor  # noqa: E402

pytestmark = pytest.mark.skipif(not quant_kernels.available(), reason="no C compiler: the kernels are not built")


def random_blocks(qtype: int, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Valid blocks of `qtype`: quantized by the `gguf` package where it can, else random bytes with small
    finite float16 scales (the K-quants, which its numpy code only dequantizes)."""
    rng = np.random.default_rng(seed)
    t = gguf.GGMLQuantizationType(qtype)
    if qtype in (8, 2, 3, 0, 1, 30):  # F32 and F16 come back as float values, the others as bytes
        return gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), t).view(np.uint8)
    _, per_block, nbytes = KERNEL_TYPES.get(qtype, (None, 256, 210))
    blocks = rng.integers(0, 256, (rows, cols // per_block, nbytes), dtype=np.uint8)
    scales = rng.uniform(-0.02, 0.02, (rows, cols // per_block, 2)).astype(np.float16).view(np.uint8)
    if qtype == 14:  # Q6_K: its float16 scale is last
        blocks[..., -2:] = scales[..., :2]
    else:
        blocks[..., 0:4] = scales.reshape(rows, cols // per_block, 4)
    return blocks.reshape(rows, -1)


TYPES = sorted(KERNEL_TYPES)


@pytest.mark.parametrize("qtype", TYPES, ids=[KERNEL_TYPES[t][0] for t in TYPES])
def test_dequantize_is_bit_exact_with_gguf(qtype):
    raw = random_blocks(qtype, 12, 512)
    w = QuantTensor(qtype, torch.from_numpy(raw.copy()), 512)
    ours = quant_kernels.dequantize_rows(w).numpy()
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype))
    assert ours.view(np.uint32).tolist() == ref.view(np.uint32).tolist()
    picked = quant_kernels.dequantize_rows(w, torch.tensor([7, 0, 7])).numpy()
    assert picked.view(np.uint32).tolist() == ref[[7, 0, 7]].view(np.uint32).tolist()


def _check_products(lib, qtype: int, rows: int) -> None:
    raw = random_blocks(qtype, 40, 512, seed=rows)
    w = QuantTensor(qtype, torch.from_numpy(raw.copy()), 512)
    dense = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype))).double()
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    ref = x.double() @ dense.T
    out = torch.full((rows, 50), 7.0)
    quant_kernels.matmul(w, x, out=out[:, 5:45], lib=lib)  # a strided column slice of a wider output
    got = out[:, 5:45].double()
    # float32 activations times the dequantized blocks: float32 rounding only.
    assert ((got - ref).norm() / ref.norm()).item() < 1e-5
    assert torch.equal(out[:, :5], torch.full((rows, 5), 7.0)) and torch.equal(out[:, 45:], torch.full((rows, 5), 7.0))
    assert torch.equal(quant_kernels.matmul(w, x, lib=lib), out[:, 5:45])


@pytest.mark.parametrize("qtype", TYPES, ids=[KERNEL_TYPES[t][0] for t in TYPES])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_matmul_against_float64(qtype, rows):
    _check_products(None, qtype, rows)


@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx2", "-mno-avx512f", "-mno-f16c")],
                         ids=["avx2", "plain-c"])
def test_matmul_fallback_paths_against_float64(flags):
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the fallback flags are x86 ones")
    lib = quant_kernels.build_library(flags)
    for qtype in TYPES:
        _check_products(lib, qtype, 5)
    # No AVX512-BF16 in these builds: asked for bfloat16, a batch gets the float32 products.
    raw = random_blocks(8, 8, 512)
    w, x = QuantTensor(8, torch.from_numpy(raw.copy()), 512), torch.randn(6, 512)
    assert torch.equal(quant_kernels.matmul(w, x, lib=lib, bf16=True), quant_kernels.matmul(w, x, lib=lib))


@pytest.mark.parametrize("qtype", TYPES, ids=[KERNEL_TYPES[t][0] for t in TYPES])
@pytest.mark.parametrize("rows", [3, 17])
def test_bf16_products_are_the_rounded_operands_products(qtype, rows):
    """quant_batch_dtype bfloat16: each dequantized weight and each activation rounded to bfloat16 (to nearest
    even), products summed in float32. 42 weight rows and 17 activation rows leave partial 4 x 4 tiles."""
    if not quant_kernels.bf16_products_available():
        pytest.skip("this CPU has no AVX512-BF16: quant_batch_dtype auto keeps float32 here")
    raw = random_blocks(qtype, 42, 512, seed=rows)
    w = QuantTensor(qtype, torch.from_numpy(raw.copy()), 512)
    dense = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)))
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    rounded = x.bfloat16().double() @ dense.bfloat16().double().T
    out = torch.full((rows, 50), 7.0)
    quant_kernels.matmul(w, x, out=out[:, 3:45], bf16=True)
    got = out[:, 3:45].double()
    assert ((got - rounded).norm() / rounded.norm()).item() < 1e-5  # float32 sums of the rounded operands
    exact = x.double() @ dense.double().T
    assert 1e-5 < ((got - exact).norm() / exact.norm()).item() < 1e-2  # bfloat16 rounding, not float32 products
    assert torch.equal(out[:, :3], torch.full((rows, 3), 7.0)) and torch.equal(out[:, 45:], torch.full((rows, 5), 7.0))
    one_row = quant_kernels.matmul(w, x[:1].contiguous(), bf16=True).double()  # one row: float32 always
    assert ((one_row - exact[:1]).norm() / exact[:1].norm()).item() < 1e-5


def test_bad_shapes_are_refused():
    raw = random_blocks(2, 4, 64)
    w = QuantTensor(2, torch.from_numpy(raw.copy()), 64)
    with pytest.raises(ValueError, match="float32"):
        quant_kernels.matmul(w, torch.randn(2, 32))
    with pytest.raises(IndexError):
        quant_kernels.dequantize_rows(w, torch.tensor([4]))
    with pytest.raises(ValueError, match="does not hold rows"):
        QuantTensor(2, torch.from_numpy(raw.copy()), 96)


def test_every_kernel_source_ships_in_the_package():
    """An installed wheel builds the kernels from its own copies: each file they include must be package data."""
    import fnmatch
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["*"]
    for source in (root / "argosy" / "engine" / "csrc").iterdir():
        assert any(fnmatch.fnmatch(source.name, p) for p in patterns), f"{source.name} is not package data"
