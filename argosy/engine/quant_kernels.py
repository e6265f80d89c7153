"""Matrix products with weights kept in GGML's quantized blocks, on the CPU (csrc/quant_matmul.c).

Built and cached like cpu_kernels.py (same compiler, flags and cache), as its own library, so that the
engine's other kernels do not depend on it. Types with a kernel: Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, F16,
BF16 and F32, whose blocks are dequantized inside the products with float32 activations (AVX-512 where the CPU has it,
else plain C that the compiler vectorizes). Other GGML types (Q6_K, ...) are dequantized to float32 at
load by the GGUF loader. F32 rows stay as the file stores them; their batches go to oneDNN (matmul).

ARGOSY_INT8_ACTIVATIONS=1 computes Q8_0, Q4_0 and Q4_1 products as llama.cpp's CPU backend does instead
(csrc/quant_int8.c): each activation row quantized to int8 blocks (Q8_0, or Q8_1 for Q4_1 weights),
then integer dot products. Off by default: it does not bring Argosy's logits to llama.cpp's (the
quantization noise makes both runs sensitive to their last float bits; BENCHMARKS.md, docs/gguf.md).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from argosy.engine import cpu_kernels, cpu_linear

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
# The batched decode path (quant_decode_batch.c) calls the attention and small-op kernels from inside its
# own OpenMP region, so their sources are built into this library too.
SOURCES = [CSRC / name for name in ("quant_matmul.c", "quant_decode.c", "quant_decode_batch.c", "quant_int8.c",
                                    "paged_attention.c", "small_ops.c")]
# GGML type number -> (name, weights per block, bytes per block)
# F32, F16 and BF16 rows count as blocks of 32 values without a scale: kept as stored, widened in the kernels.
KERNEL_TYPES = {8: ("Q8_0", 32, 34), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 12: ("Q4_K", 256, 144),
                13: ("Q5_K", 256, 176), 1: ("F16", 32, 64), 30: ("BF16", 32, 64), 0: ("F32", 32, 128)}
# Weight type -> its activations' int8 block type (GGML numbers: 8 = Q8_0, 9 = Q8_1), where it has one.
INT8_ACTIVATION_TYPES = {8: 8, 2: 8, 3: 9}
F32 = 0
I64, PTR = ctypes.c_int64, ctypes.c_void_p


@dataclass(frozen=True)
class QuantTensor:
    """A [rows, cols] matrix in one GGML block type: `data` holds each row's blocks, [rows, row_bytes] uint8."""

    qtype: int
    data: torch.Tensor
    cols: int

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def name(self) -> str:
        return KERNEL_TYPES[self.qtype][0]

    def __post_init__(self) -> None:
        if self.qtype not in KERNEL_TYPES:
            raise ValueError(f"no quantized kernel for GGML type {self.qtype}")
        _, per_block, nbytes = KERNEL_TYPES[self.qtype]
        if self.cols % per_block or self.data.dtype != torch.uint8 or self.data.dim() != 2 \
                or self.data.shape[1] != self.cols // per_block * nbytes or not self.data.is_contiguous():
            raise ValueError(f"{self.name} data of shape {tuple(self.data.shape)} does not hold rows of {self.cols}")


def _load(lib_path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(lib_path))
    lib.quant_matmul_f32.argtypes = [I64, PTR, I64, I64, PTR, I64, PTR, I64, I64]
    lib.quant_matmul_f32.restype = I64
    lib.dequantize_rows_f32.argtypes = [I64, PTR, I64, PTR, I64, PTR]
    lib.dequantize_rows_f32.restype = I64
    lib.quant_decode_layers.argtypes = [I64, PTR, PTR, *[I64] * 5, ctypes.c_float, PTR, PTR, PTR, *[I64] * 4,
                                        ctypes.c_float, I64, I64]
    lib.quant_matmul_bf16.argtypes = [I64, PTR, I64, I64, PTR, I64, PTR, I64, I64]
    lib.quant_matmul_bf16.restype = I64
    lib.quant_matmul_int8.argtypes = [I64, PTR, I64, I64, PTR, I64, PTR, I64, I64]
    lib.quant_matmul_int8.restype = I64
    lib.quantize_rows_q8.argtypes = [I64, PTR, I64, I64, PTR]
    lib.quantize_rows_q8.restype = I64
    lib.quant_decode_layers.restype = I64
    lib.quant_decode_batch.argtypes = [I64, PTR, PTR, *[I64] * 6, ctypes.c_float, PTR, PTR, PTR, I64, PTR, PTR,
                                       I64, I64, ctypes.c_float, I64]
    lib.quant_decode_batch.restype = I64
    return lib


def build_library(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """Builds (or finds in the cache) the library; extra_flags select other code paths (tests: -mno-avx2 ...)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH")
    flags = [*cpu_kernels.FLAGS, *extra_flags]
    return _load(cpu_kernels._build(compiler, SOURCES, flags, stem="argosy-quant"))


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("ARGOSY_CPU_KERNELS", "1") == "0":
        return None
    try:
        return build_library()
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        logger.warning("quantized CPU kernels unavailable (%s); quantized weights are dequantized at load",
                       getattr(e, "stderr", "") or e)
        return None


def available() -> bool:
    return _library() is not None


def int8_activations() -> bool:
    """Whether products take int8 activations, as llama.cpp's (ARGOSY_INT8_ACTIVATIONS=1; off by default)."""
    return os.environ.get("ARGOSY_INT8_ACTIVATIONS", "0") == "1"


@functools.cache
def bf16_products_available() -> bool:
    """Whether the library was built with AVX512-BF16 (csrc/quant_matmul.c, quant_matmul_bf16)."""
    lib = _library()
    if lib is None:
        return False
    w, x, y = torch.zeros(1, 34, dtype=torch.uint8), torch.zeros(3, 32), torch.empty(3, 1)
    return lib.quant_matmul_bf16(8, w.data_ptr(), 1, 32, x.data_ptr(), 3, y.data_ptr(), 1, 1) != -1


def matmul(w: QuantTensor, x: torch.Tensor, out: torch.Tensor | None = None, lib: ctypes.CDLL | None = None,
           int8: bool | None = None, bf16: bool = False) -> torch.Tensor:
    """x [rows, cols] float32 -> x @ w.T, [rows, w.rows]; into `out` (a [rows, >= w.rows] view whose rows
    may be strided, e.g. a column slice of a wider output) where given. int8 (default: int8_activations())
    quantizes x to int8 blocks first where w's type has such a product; else bf16 computes products of 3
    or more rows with bfloat16 operands where the library has the instructions (float32 elsewhere)."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != w.cols:
        raise ValueError(f"x must be float32 [rows, {w.cols}], got {x.dtype} {tuple(x.shape)}")
    x = x.contiguous()
    if out is not None and (out.shape != (x.shape[0], w.rows) or out.stride(1) != 1 or out.dtype != torch.float32):
        raise ValueError("out must be float32 [rows, w.rows] with contiguous rows")
    if int8 is None:
        int8 = int8_activations()
    lib = lib or _library()
    if w.qtype == F32 and x.shape[0] > 2 and not (bf16 and bf16_products_available()):
        # A float32 batch: oneDNN over the same bytes beats the float32 tiles here (64 sequences of SmolLM2
        # F32: 790 against 580 tok/s); the kernels keep one or two rows (and the one-token path).
        weight = w.data.view(torch.float32)
        y = cpu_linear.onednn_linear(x, weight, None) if cpu_linear.onednn_linear_works(torch.float32) \
            else F.linear(x, weight)
        return y if out is None else out.copy_(y)
    if out is None:
        out = x.new_empty((x.shape[0], w.rows))
    args = (w.qtype, w.data.data_ptr(), w.rows, w.cols, x.data_ptr(), x.shape[0], out.data_ptr(), out.stride(0),
            torch.get_num_threads())
    if int8 and w.qtype in INT8_ACTIVATION_TYPES:
        rc = lib.quant_matmul_int8(*args)
    else:
        rc = lib.quant_matmul_bf16(*args) if bf16 and x.shape[0] > 2 else -1
        if rc == -1:  # float32 asked for, one or two rows, or a build without AVX512-BF16
            rc = lib.quant_matmul_f32(*args)
    if rc:
        raise MemoryError("quantized matmul: out of memory") if rc == -2 else ValueError("quantized matmul: bad shape")
    return out


def quantize_activations(x: torch.Tensor, act_type: int, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """x [rows, cols] float32 -> GGML Q8_0 (act_type 8: 34 bytes per 32 values) or Q8_1 (9: 36 bytes) blocks,
    [rows, cols / 32 * bytes] uint8, as llama.cpp quantizes the activations of its products."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] % 32 or act_type not in (8, 9):
        raise ValueError("x must be float32 [rows, a multiple of 32] and act_type 8 (Q8_0) or 9 (Q8_1)")
    x = x.contiguous()
    out = torch.empty((x.shape[0], x.shape[1] // 32 * (34 if act_type == 8 else 36)), dtype=torch.uint8)
    (lib or _library()).quantize_rows_q8(act_type, x.data_ptr(), x.shape[0], x.shape[1], out.data_ptr())
    return out


def dequantize_rows(w: QuantTensor, ids: torch.Tensor | None = None, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """Rows `ids` (int64; all rows when None) of w as float32, exactly as GGML dequantizes them."""
    if ids is not None:
        ids = ids.reshape(-1).to(torch.int64).contiguous()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= w.rows):
            raise IndexError(f"row id out of range [0, {w.rows})")
    n = w.rows if ids is None else ids.numel()
    y = torch.empty((n, w.cols), dtype=torch.float32)
    (lib or _library()).dequantize_rows_f32(w.qtype, w.data.data_ptr(), w.cols,
                                           None if ids is None else ids.data_ptr(), n, y.data_ptr())
    return y
