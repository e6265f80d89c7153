"""The hooks a platform offers the runners; this base is what a device with no special handling gets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from argosy.engine.checkpoint import ModelConfig
from argosy.engine.config import EngineConfig
from argosy.engine.memory_profile import ProfileStep

if TYPE_CHECKING:
    from argosy.engine.cuda_graphs import GraphCapture

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Platform:
    name = "generic"
    # The most K and V bytes (one layer) that one gathered decode group may copy; None: no bound.
    decode_copy_bytes: int | None = None

    def prepare_process(self) -> None:
        """Process-wide settings, before anything large is allocated."""

    def use_threads(self, threads: int | None, ranks: int = 1) -> None:
        """The host's threads for this process's kernels: `threads`, or None for the device's default
        (this process being one of `ranks` engine processes spawned on one host)."""

    def default_dtype(self, model_cfg: ModelConfig) -> torch.dtype:
        return DTYPES.get(str(model_cfg.torch_dtype), torch.bfloat16)

    def place_weights(self, model: torch.nn.Module) -> None:
        """Before the checkpoint is copied in (the parameters' values are not kept)."""

    def tune_model(self, model: torch.nn.Module, config: EngineConfig, dtype: torch.dtype) -> None:
        """After the weights are loaded: faster kernels for this device, same outputs."""

    def kv_cache_budget(self, config: EngineConfig, profile: Sequence[ProfileStep] = ()) -> float:
        """Bytes for the KV cache when config.kv_cache_memory_gib is unset. profile: the largest steps the
        engine will run, for a platform that measures them (memory_profile.py); empty on a parallel rank."""
        raise ValueError("set kv_cache_memory_gib: there is no default KV cache size on this device")

    def kv_cache_tensor(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """One layer's KV cache, zeros (an unwritten slot is read as 0, never NaN, by masked attention)."""
        return torch.zeros(shape, dtype=dtype, device=device)

    def graph_capture(self) -> GraphCapture | None:
        """How decode steps are captured for replay (CUDA graphs), or None: every step runs eagerly."""
        return None


def resolve_dtype(config: EngineConfig, model_cfg: ModelConfig, platform: Platform) -> torch.dtype:
    return DTYPES[config.dtype] if config.dtype != "auto" else platform.default_dtype(model_cfg)
