"""C kernels for the CPU, built on first use with the system's C compiler, as Inductor builds its own.

- csrc/paged_attention.c: decode attention read straight from the paged KV cache. On the 2-core test
  machine it took decode attention from gather + SDPA's 4.7 to 10.4-10.9 GB/s of K/V read
  (/tmp-style microbenchmark of 200 decodes, 2026-12-03).
- csrc/matvec.c: one row times a weight matrix, for steps that decode a single sequence.
- csrc/small_ops.c: RMS norm and RoPE, one call each instead of eight PyTorch ops; the write of a
  step's K/V into the cache.

The shared library is cached under ~/.cache/argosy/kernels, keyed by the sources, the flags, the
compiler and the CPU (it is built with -march=native). Where building fails, or with
ARGOSY_CPU_KERNELS=0, the engine logs it and keeps plain PyTorch (gather + SDPA, oneDNN linears).

Container images carry the library prebuilt for a named target instead (no compiler at run time):
`python -m argosy.engine.cpu_kernels --march x86-64-v3 --out DIR` writes DIR/argosy-cpu.so and a
.target file beside it, and ARGOSY_CPU_KERNELS_LIB names it. It is loaded only on a CPU that has the
target's instructions (else the engine keeps plain PyTorch, as above): an AVX2 library on an older CPU
would die on its first call with SIGILL rather than fail to load.
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
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCES = [Path(__file__).parent / "csrc" / name for name in ("paged_attention.c", "matvec.c", "small_ops.c")]
# Not -ffast-math: with GCC 12 a shared library built with it turns on flush-to-zero for the whole process.
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros",
         "-fopenmp", "-shared", "-fPIC"]

I64, PTR = ctypes.c_int64, ctypes.c_void_p


def _cpu_identity() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return "".join(line for line in f if line.startswith(("model name", "flags")))[:4096]
    except OSError:
        return os.uname().machine


# /proc/cpuinfo flags a prebuilt library's -march needs (the x86-64 psABI levels; a subset that tells them apart).
TARGET_FLAGS = {"x86-64": set(), "x86-64-v2": {"sse4_2", "popcnt", "ssse3"},
                "x86-64-v3": {"sse4_2", "popcnt", "avx", "avx2", "fma", "bmi2", "f16c"},
                "x86-64-v4": {"avx2", "fma", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}}


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def build_for_target(out_dir: str | Path, march: str, compiler: str = "cc") -> Path:
    """Builds the library for `march` (a TARGET_FLAGS name) into out_dir/argosy-cpu.so, with its .target."""
    if march not in TARGET_FLAGS:
        raise ValueError(f"unknown target {march!r}; one of {', '.join(TARGET_FLAGS)}")
    out = Path(out_dir) / "argosy-cpu.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    flags = [f"-march={march}" if f == "-march=native" else f for f in FLAGS]
    subprocess.run([compiler, *flags, *map(str, SOURCES), "-o", str(out)], check=True, timeout=300)
    out.with_suffix(".target").write_text(march + "\n")
    return out


def _prebuilt(path: str) -> Path:
    """ARGOSY_CPU_KERNELS_LIB: the library, if this CPU runs its target's instructions."""
    lib = Path(path)
    target = lib.with_suffix(".target")
    march = target.read_text().strip() if target.exists() else "?"
    missing = TARGET_FLAGS.get(march, {"?"}) - _cpu_flags()
    if missing:
        raise RuntimeError(f"{lib} is built for {march}; this CPU lacks {', '.join(sorted(missing))}")
    return lib


def _build(compiler: str, sources: list[Path] = SOURCES, flags: list[str] = FLAGS, stem: str = "argosy-cpu") -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    headers = sorted({h for s in sources for h in s.parent.glob("*.h")})  # included by the sources: part of the key
    parts = [*(s.read_text() for s in [*sources, *headers]), *flags, version, _cpu_identity()]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "argosy" / "kernels"
    target = cache / f"{stem}-{key[:16]}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".so")
    os.close(fd)
    try:
        subprocess.run([compiler, *flags, *map(str, sources), "-o", tmp], capture_output=True, text=True,
                       check=True, timeout=120)
        os.replace(tmp, target)  # atomic: a process building the same kernels at once loses nothing
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("ARGOSY_CPU_KERNELS", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    prebuilt = os.environ.get("ARGOSY_CPU_KERNELS_LIB")
    try:
        if prebuilt:
            lib = ctypes.CDLL(str(_prebuilt(prebuilt)))
        elif compiler is None:
            raise RuntimeError("no C compiler (cc or gcc) on PATH")
        else:
            lib = ctypes.CDLL(str(_build(compiler)))
        _declare(lib)  # a prebuilt library from an older release may lack a function: AttributeError
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as e:
        detail = getattr(e, "stderr", "") or e
        logger.warning("CPU kernels unavailable (%s); using plain PyTorch (gather + SDPA, oneDNN linears)", detail)
        return None
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    lib.paged_decode_attention_f32.argtypes = [PTR, PTR, PTR, I64, PTR, PTR, *[I64] * 6, ctypes.c_float, I64]
    lib.matvec_f32.argtypes = [PTR, PTR, PTR, I64, I64, I64]
    lib.rms_norm_f32.argtypes = [PTR, PTR, PTR, I64, I64, ctypes.c_float, I64]
    lib.rope_f32.argtypes = [PTR, PTR, PTR, I64, I64, I64, I64, I64]
    lib.write_kv_f32.argtypes = [PTR, PTR, PTR, I64, I64, PTR, I64, I64, I64]
    lib.silu_mul_f32.argtypes = [PTR, PTR, I64, I64, I64]
    for fn in (lib.paged_decode_attention_f32, lib.matvec_f32, lib.rms_norm_f32, lib.rope_f32, lib.silu_mul_f32):
        fn.restype = None
    lib.write_kv_f32.restype = I64


def available() -> bool:
    """Whether the kernels could be built and loaded here (a failure is logged once)."""
    return _library() is not None


def _require(ok: bool, what: str) -> None:
    # Real checks, not asserts (python -O drops those): a wrong shape here reads or writes out of bounds.
    if not ok:
        raise ValueError(f"CPU kernel: {what}")


def paged_decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """q [n, heads, dim] -> out, like q; kv_cache [2, blocks, block_size, kv_heads, dim] float32;
    tables [n, width] and lens [n] int64, every table covering its length."""
    q = q.contiguous()
    n, heads, dim = q.shape
    _, num_blocks, block_size, kv_heads, _ = kv_cache.shape
    _require(kv_cache.is_contiguous() and q.dtype == kv_cache.dtype == torch.float32, "float32, contiguous cache")
    _require(tables.dtype == lens.dtype == torch.int64 and tables.is_contiguous() and tables.shape[0] == n == len(lens),
             "int64 tables and lengths, one per query")
    _require(n == 0 or int(lens.max()) <= tables.shape[1] * block_size, "a block table is shorter than its context")
    out = torch.empty_like(q)
    _library().paged_decode_attention_f32(
        q.data_ptr(), kv_cache.data_ptr(), tables.data_ptr(), tables.shape[1], lens.data_ptr(), out.data_ptr(), n,
        heads, kv_heads, dim, block_size, num_blocks, scale, torch.get_num_threads())
    return out


def matvec(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """w [out, in] times x [1, in] -> [1, out], float32. The caller checks the weight once (contiguous,
    float32): this runs 49 times a token on a 12-layer model."""
    _require(x.dtype == torch.float32 and x.shape == (1, w.shape[1]), f"x must be float32 [1, {w.shape[1]}]")
    x = x.contiguous()
    y = x.new_empty((1, w.shape[0]))
    _library().matvec_f32(w.data_ptr(), x.data_ptr(), y.data_ptr(), w.shape[0], w.shape[1], torch.get_num_threads())
    return y


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [rows, dim], weight [dim] (float32) -> weight * x / sqrt(mean(x^2) + eps)."""
    x = x.contiguous()
    _require(x.dtype == weight.dtype == torch.float32 and x.dim() == 2 and weight.shape == (x.shape[1],),
             "float32 x [rows, dim] and weight [dim]")
    out = torch.empty_like(x)
    _library().rms_norm_f32(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps,
                            torch.get_num_threads())
    return out


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """gu [rows, 2 * inter] (gate, then up) -> silu(gate) * up, [rows, inter]: the MLP's activation."""
    gu = gu.contiguous()
    _require(gu.dtype == torch.float32 and gu.dim() == 2 and gu.shape[1] % 2 == 0, "float32 gu [rows, 2 * inter]")
    out = gu.new_empty((gu.shape[0], gu.shape[1] // 2))
    _library().silu_mul_f32(gu.data_ptr(), out.data_ptr(), gu.shape[0], gu.shape[1] // 2, torch.get_num_threads())
    return out


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, head_dim: int) -> None:
    """Rotates in place the first `heads` heads (of `head_dim`) of each row of x [rows, width];
    cos, sin [rows, 1, head_dim / 2], all float32."""
    rows = x.shape[0]
    _require(x.is_contiguous() and cos.is_contiguous() and sin.is_contiguous(), "contiguous x, cos and sin")
    _require(x.dtype == cos.dtype == sin.dtype == torch.float32, "float32 x, cos and sin")
    _require(heads * head_dim <= x.shape[1], "the rotated heads fit in a row")
    _require(cos.numel() == sin.numel() == rows * (head_dim // 2), "cos and sin of [rows, head_dim / 2]")
    _library().rope_f32(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), rows, x.shape[1], heads, head_dim,
                        torch.get_num_threads())


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """kv_cache [2, blocks, block_size, kv_heads, dim]; k, v [T, kv_heads, dim] with each token's heads
    contiguous; slots [T] int64."""
    rows, heads, dim = k.shape
    _require(kv_cache.is_contiguous() and slots.is_contiguous() and slots.dtype == torch.int64, "int64 slots")
    _require(k.dtype == v.dtype == kv_cache.dtype == torch.float32 and v.shape == k.shape == (len(slots), heads, dim),
             "float32 k and v, one row per slot")
    _require(k.stride(2) == v.stride(2) == 1 and k.stride(1) == v.stride(1) == dim, "each token's heads contiguous")
    num_slots = kv_cache.shape[1] * kv_cache.shape[2]
    bad = _library().write_kv_f32(kv_cache.data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(0), v.stride(0),
                                  slots.data_ptr(), rows, heads * dim, num_slots)
    if bad:
        raise IndexError(f"{bad} KV slot(s) outside the cache's {num_slots}")


if __name__ == "__main__":  # image builds: python -m argosy.engine.cpu_kernels --march x86-64-v3 --out DIR
    import argparse

    ap = argparse.ArgumentParser(description="build the CPU kernels for a target, for a container image")
    ap.add_argument("--march", default="x86-64-v3", choices=sorted(TARGET_FLAGS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    args = ap.parse_args()
    built = build_for_target(args.out, args.march, args.cc)
    print(f"built {built} for {built.with_suffix('.target').read_text().strip()}")
