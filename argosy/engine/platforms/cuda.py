"""CUDA: every CUDA-specific choice the engine makes, in the order a runner meets them.

- bfloat16 by default (float16 for a float16 checkpoint), as vLLM does for float32 checkpoints too.
- Once loaded: RMS norm (the post-attention one with its residual add fused) and RoPE through the Triton
  kernels (triton_ops/norm_rope.py) where triton is installed.
- Attention: the Triton backend (attention/triton_backend.py), else gather + SDPA.
- The KV cache: what gpu_memory_utilization leaves once the largest steps have run (memory_profile.py).
- Decode steps replayed from CUDA graphs (cuda_graphs.py) unless enforce_eager.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from argosy.engine import triton_ops
from argosy.engine.config import EngineConfig
from argosy.engine.cuda_graphs import CudaGraphCapture, GraphCapture
from argosy.engine.memory_profile import CudaMemory, DeviceMemory, ProfileStep, profile_steps
from argosy.engine.models.llama import Attention, RMSNorm
from argosy.engine.platforms.base import Platform


class CudaPlatform(Platform):
    name = "cuda"

    def __init__(self, device: torch.device, memory: DeviceMemory | None = None):
        self.device = device
        self.memory = memory or CudaMemory(device)
        self.last_profile = None  # the MemoryProfile the KV cache was sized from (logged, and read by tests)

    def default_dtype(self, model_cfg) -> torch.dtype:
        return torch.float16 if str(model_cfg.torch_dtype) == "float16" else torch.bfloat16

    def tune_model(self, model: torch.nn.Module, config: EngineConfig, dtype: torch.dtype) -> None:
        use_triton_small_ops(model)

    def kv_cache_budget(self, config: EngineConfig, profile: Sequence[ProfileStep] = ()) -> float:
        if not profile:  # a parallel rank: its steps need the other ranks, so it is not profiled
            free, total = self.memory.mem_get_info()
            return config.gpu_memory_utilization * total - (total - free)
        self.last_profile = profile_steps(self.memory, profile)
        return self.last_profile.kv_cache_bytes(config.gpu_memory_utilization)

    def graph_capture(self) -> GraphCapture | None:
        return CudaGraphCapture(self.device)


def use_triton_small_ops(model: torch.nn.Module) -> bool:
    """RMS norm, the fused residual add + RMS norm, and RoPE through the Triton kernels; False (nothing
    changed) where they cannot run (no triton, or the CPU without the interpreter)."""
    if not triton_ops.runs_on(next(model.parameters()).device):
        return False
    from argosy.engine.triton_ops import norm_rope  # imports triton

    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.kernel = norm_rope.rms_norm
            module.add_kernel = norm_rope.add_rms_norm
        elif isinstance(module, Attention):
            module.rope_kernel = norm_rope.rope_
    return True
