"""CUDA: the checkpoint's dtype, and a KV cache sized from what gpu_memory_utilization leaves."""

from __future__ import annotations

import torch

from argosy.engine.config import EngineConfig
from argosy.engine.platforms.base import Platform


class CudaPlatform(Platform):
    name = "cuda"

    def __init__(self, device: torch.device):
        self.device = device

    def kv_cache_budget(self, config: EngineConfig) -> float:
        # Called once the weights are loaded: what they and the CUDA context use is already taken.
        free, total = torch.cuda.mem_get_info(self.device)
        return config.gpu_memory_utilization * total - (total - free)
