"""The matrix product the attention kernels use (see triton_ops.dot_constants)."""

import triton
import triton.language as tl


@triton.jit
def mma(a, b, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """a @ b accumulated in float32."""
    if DOT_UPCAST:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b, input_precision=DOT_PRECISION)
    return c
