"""C kernels for the CPU, built on first use with the system's C compiler, as Inductor builds its own.

One kernel so far: decode attention read straight from the paged KV cache (csrc/paged_attention.c).
It took decode attention from gather + SDPA's 4.7 to 8.9 GB/s of K/V read (/tmp-style microbenchmark
of 200 decodes, 2026-12-03). The shared library is cached under ~/.cache/argosy/kernels, keyed by the
source, the flags, the compiler and the CPU (it is built with -march=native). Where building fails, or
ARGOSY_CPU_KERNELS=0, the engine logs it and keeps gather + SDPA.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_attention.c"
# Not -ffast-math: with GCC 12 a shared library built with it turns on flush-to-zero for the whole process.
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros",
         "-fopenmp", "-shared", "-fPIC"]

DecodeKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def _cpu_identity() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return "".join(line for line in f if line.startswith(("model name", "flags")))[:4096]
    except OSError:
        return os.uname().machine


def _build(compiler: str) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), *FLAGS, version, _cpu_identity()]).encode()).hexdigest()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "argosy" / "kernels"
    target = cache / f"paged_attention-{key[:16]}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".so")
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True,
                       check=True, timeout=120)
        os.replace(tmp, target)  # atomic: a process building the same kernel at once loses nothing
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.cache
def paged_decode_kernel() -> DecodeKernel | None:
    """The decode attention kernel, or None (logged) where it cannot be built or is switched off."""
    if os.environ.get("ARGOSY_CPU_KERNELS", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    try:
        if compiler is None:
            raise RuntimeError("no C compiler (cc or gcc) on PATH")
        lib = ctypes.CDLL(str(_build(compiler)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or e
        logger.warning("CPU attention kernel unavailable (%s); decode attention uses gather + SDPA", detail)
        return None
    fn = lib.paged_decode_attention_f32
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [ptr, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64, i64, ctypes.c_float, i64]
    fn.restype = None

    def run(q: torch.Tensor, kv_cache: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor,
            scale: float) -> torch.Tensor:
        """q [n, heads, dim] -> out, like q; kv_cache [2, blocks, block_size, kv_heads, dim] float32;
        tables [n, width] and lens [n] int64, every table covering its length."""
        q = q.contiguous()
        n, heads, dim = q.shape
        _, num_blocks, block_size, kv_heads, _ = kv_cache.shape
        assert kv_cache.is_contiguous() and q.dtype == kv_cache.dtype == torch.float32
        assert tables.dtype == lens.dtype == torch.int64 and tables.is_contiguous() and tables.shape[0] == n
        if n and int(lens.max()) > tables.shape[1] * block_size:  # the C code would read past the table
            raise ValueError("a block table is shorter than its context length")
        out = torch.empty_like(q)
        fn(q.data_ptr(), kv_cache.data_ptr(), tables.data_ptr(), tables.shape[1], lens.data_ptr(),
           out.data_ptr(), n, heads, kv_heads, dim, block_size, num_blocks, scale, torch.get_num_threads())
        return out

    return run
