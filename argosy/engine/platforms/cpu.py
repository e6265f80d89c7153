"""The CPU: every CPU-specific choice the engine makes, in the order a runner meets them.

- The process: glibc keeps freed memory in its heap (cpu_memory.keep_freed_memory); the kernels run
  on `cpu_threads`, else on the cores the process may use (cgroup quota included), shared among the
  ranks spawned on one host.
- float32 by default: half-precision matmuls on most CPUs are slower than float32.
- The weights go into memory advised to transparent huge pages before the checkpoint is copied in
  (cpu_memory.weights_in_huge_pages).
- Once loaded: Linear layers on oneDNN, and single rows on the C matrix-vector kernel (cpu_linear.py),
  or the opt-in compiled one (matvec.py); RMS norm and RoPE through the C kernels (float32). Weights in
  GGML blocks (QuantLinear): batched products in bfloat16 where the CPU has AVX512-BF16 (quant_batch_dtype).
- The KV cache: CPU_DEFAULT_KV_GIB, or a quarter of the available RAM if less.
- Attention: the C decode kernel where it could be built (attention/cpu_kernel.py), else gather + SDPA
  with each decode group's copy bounded so that it stays in the cores' caches.
"""

from __future__ import annotations

import logging
import os

import torch

from argosy.engine import cpu_kernels, quant_kernels
from argosy.engine.config import CPU_DEFAULT_KV_GIB, EngineConfig
from argosy.engine.cpu_linear import route_cpu_linears
from argosy.engine.cpu_memory import keep_freed_memory, weights_in_huge_pages, zeroed_on_first_touch
from argosy.engine.host_cores import usable_cores
from argosy.engine.models.llama import MLP, Attention, RMSNorm
from argosy.engine.platforms.base import Platform
from argosy.engine.quant_linear import QuantLinear

log = logging.getLogger("argosy.engine")
GIB = 1 << 30
CPU_DECODE_GROUP_BYTES = 4 << 20  # K and V of one decode group, one layer (measured best of 1-32 MiB)


class CpuPlatform(Platform):
    name = "cpu"
    decode_copy_bytes = CPU_DECODE_GROUP_BYTES

    def prepare_process(self) -> None:
        keep_freed_memory()

    def use_threads(self, threads: int | None, ranks: int = 1) -> None:
        """threads given (EngineConfig.cpu_threads): that many. Else the usable cores shared among the
        host's ranks, where that is fewer than torch would run: OMP_NUM_THREADS, or a lower count a
        caller set, stays."""
        cores = usable_cores()
        if threads is None:
            share = max(1, cores // ranks)
            if "OMP_NUM_THREADS" in os.environ or share >= torch.get_num_threads():
                return
            threads = share
        elif threads > cores:
            log.warning("cpu_threads %d exceeds the %d cores this process may use: its threads will take turns on "
                        "them", threads, cores)
        torch.set_num_threads(threads)

    def default_dtype(self, model_cfg) -> torch.dtype:
        return torch.float32

    def place_weights(self, model: torch.nn.Module) -> None:
        weights_in_huge_pages(model)

    def tune_model(self, model: torch.nn.Module, config: EngineConfig, dtype: torch.dtype) -> None:
        routed = route_cpu_linears(model)
        matvec = False
        if config.compile_matvec:
            from argosy.engine.matvec import enable_compiled_matvec  # imports Inductor: only when asked for

            matvec = enable_compiled_matvec(model)  # wraps the one-row case
        if not (routed or matvec):  # both want [out, in] weights; F.linear (MKL) does better with [in, out]
            store_linears_transposed(model)
        if dtype == torch.float32:
            use_small_op_kernels(model)
        set_quant_batch_dtype(model, config.quant_batch_dtype)

    def kv_cache_budget(self, config: EngineConfig, profile=()) -> float:
        return min(CPU_DEFAULT_KV_GIB * GIB, 0.25 * available_memory())

    def kv_cache_tensor(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return zeroed_on_first_touch(shape, dtype)


def set_quant_batch_dtype(model: torch.nn.Module, choice: str) -> None:
    """Each QuantLinear's batched products in bfloat16 or float32 (EngineConfig.quant_batch_dtype)."""
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    if not layers:
        return
    available = quant_kernels.bf16_products_available()
    if choice == "bfloat16" and not available:
        raise ValueError("quant_batch_dtype bfloat16 needs a CPU with AVX512-BF16, which this one lacks: "
                         "use auto or float32")
    # auto leaves F32 weights in float32: a float32 file promises the float32 model's tokens (docs/gguf.md).
    types = frozenset() if not available or choice == "float32" else \
        frozenset(quant_kernels.KERNEL_TYPES) - ({quant_kernels.F32} if choice == "auto" else set())
    for layer in layers:
        layer.bf16_batch_types = types


def store_linears_transposed(model: torch.nn.Module) -> None:
    """Keeps each linear weight as a transposed view of an [in, out] buffer.

    F.linear then hands MKL the [in, out] layout, whose matrix-vector products stream memory about 20%
    faster on the CPU: that is most of a decode step. A weight shared with the embedding (tied) stays,
    since the embedding lookup needs whole rows.
    """
    shared = model.embed_tokens.weight
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight is not shared:
            module.weight = torch.nn.Parameter(module.weight.data.t().contiguous().t(), requires_grad=False)


def use_small_op_kernels(model: torch.nn.Module) -> None:
    """RMS norm, RoPE and SiLU(gate) * up through the C kernels of cpu_kernels (CPU, float32), where built."""
    if not cpu_kernels.available():
        return
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.kernel = cpu_kernels.rms_norm
        elif isinstance(module, Attention):
            module.rope_kernel = cpu_kernels.rope_
        elif isinstance(module, MLP):
            module.act_kernel = cpu_kernels.silu_mul


def available_memory() -> float:
    """Bytes of RAM still available (Linux); a large number where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")
