"""Triton kernels for the CUDA path: paged attention (decode split across programs, then reduced;
prefill and mixed steps over variable-length chunks reading the paged cache), the K/V write into the
cache, RMS norm (with the residual add fused) and RoPE.

Each op builds a `Launch` (kernel, grid, arguments, compile-time constants) and runs it; the tests run
the same launches under Triton's interpreter on the CPU (TRITON_INTERPRET=1, set before triton is
imported) against float64 references, and compile them ahead of time for the H200 (sm_90) without a GPU
(tests/test_triton_kernels.py, tests/triton_checks.py).

`triton` is optional (`pip install 'argosy[gpu]'`): without it `available()` is False and the engine
keeps its other attention backends. The kernel modules import triton, so only code that runs a kernel
imports them (the interpreter must be switched on before that first import).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any

import torch


@functools.cache
def available() -> bool:
    """Whether triton is installed. The kernel modules import it (about a second) when first used."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Triton's interpreter runs the kernels on CPU tensors (exactly and slowly); it must be switched on
    before triton is imported, which is why this reads the environment rather than a setting."""
    return available() and os.environ.get("TRITON_INTERPRET") == "1"


def runs_on(device: torch.device) -> bool:
    """Where these kernels run: CUDA, or the CPU under the interpreter."""
    if not available():
        return False
    return device.type == "cuda" or (device.type == "cpu" and interpreting())


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def dot_constants(dtype: torch.dtype) -> dict[str, Any]:
    """How the attention kernels' tl.dot treats operands of this dtype (see dot.py's mma).

    float32 operands would go through TF32 on NVIDIA GPUs by default (10 mantissa bits): IEEE float32
    is asked for. Under the interpreter, bfloat16 operands are upcast first: the interpreter keeps
    bfloat16 as raw 16-bit integers and its dot multiplies those (triton-lang/triton#11584), so on the
    CPU a bfloat16 product is computed from the same values in float32 (what the tensor cores' bf16 x
    bf16 -> fp32 products give, up to the order of the sums)."""
    return {"DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",
            "DOT_UPCAST": interpreting() and dtype == torch.bfloat16}


@dataclass
class Launch:
    """One kernel launch, kept as data so that tests can also compile it ahead of time for a GPU."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple
    constants: dict[str, Any] = field(default_factory=dict)
    num_warps: int = 4

    def run(self) -> None:
        if all(self.grid):  # an empty batch launches nothing
            self.kernel[self.grid](*self.args, **self.constants, num_warps=self.num_warps)

    def compile_for(self, arch: int = 90) -> Any:
        """Compiles the kernel ahead of time for an NVIDIA GPU of this compute capability (90: H100 and
        H200) with these arguments' types and constants; needs no GPU (Triton ships ptxas)."""
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        names = self.kernel.arg_names
        signature: dict[str, str] = {}
        for name, value in zip(names, self.args, strict=False):
            if isinstance(value, torch.Tensor):
                signature[name] = "*" + POINTER_TYPES[value.dtype]
            elif isinstance(value, bool):
                signature[name] = "i1"
            elif isinstance(value, int):
                signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            else:
                signature[name] = "fp32"
        signature.update({name: "constexpr" for name in names[len(self.args):]})
        source = ASTSource(self.kernel, signature, {name: self.constants[name] for name in names[len(self.args):]})
        return triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": self.num_warps})


POINTER_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64",
                 torch.int32: "i32"}
