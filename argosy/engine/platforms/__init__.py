"""What differs by device, in one object per kind: the process's memory set-up, the default dtype,
where the weights are put and how the loaded model is tuned, the KV cache's default budget and the
bound on what attention may copy. The runners call these hooks and hold no device branches.

base.py   Platform: the hooks, and what a device without special handling gets
cpu.py    glibc's allocator, huge pages, oneDNN linears and the C kernels, threads of the ranks
cuda.py   the KV cache from gpu_memory_utilization, the checkpoint's dtype
"""

from __future__ import annotations

import torch

from argosy.engine.platforms.base import Platform


def platform_for(device: torch.device) -> Platform:
    if device.type == "cpu":
        from argosy.engine.platforms.cpu import CpuPlatform

        return CpuPlatform()
    if device.type == "cuda":
        from argosy.engine.platforms.cuda import CudaPlatform

        return CudaPlatform(device)
    return Platform()


__all__ = ["Platform", "platform_for"]
