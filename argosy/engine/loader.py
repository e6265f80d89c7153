"""Checkpoint -> model. `open_checkpoint(path)` is the one seam every checkpoint format goes through:
it gives the model's config, its weights (streamed, HF names) and its tokenizer. A new format (GGUF)
is one more Checkpoint, chosen in open_checkpoint; the runners and the engine stay as they are.
(The parallel ranks read only their shard, straight from the safetensors files: parallel/model.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from argosy.engine.checkpoint import ModelConfig, iter_weights
from argosy.engine.checkpoint_config import checked_config
from argosy.engine.config import EngineConfig
from argosy.engine.gguf.file import is_gguf
from argosy.engine.models.llama import LlamaForCausalLM, rope_inv_freq
from argosy.engine.models.skeleton import materialize
from argosy.engine.platforms import Platform
from argosy.engine.tokenizer import Tokenizer


class Checkpoint(Protocol):
    path: str
    config: ModelConfig

    def weights(self, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
        """(Hugging Face name, tensor) pairs, one tensor at a time."""
        ...

    def tokenizer(self) -> Tokenizer:
        ...


@dataclass(frozen=True)
class HFCheckpoint:
    """A Hugging Face folder: config.json, safetensors (one file or sharded), tokenizer files."""

    path: str
    config: ModelConfig

    def weights(self, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
        return iter_weights(self.path, device)

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_pretrained(self.path)


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Reads the checkpoint's config (a missing folder or config.json is named here, before anything
    else is read); the weights and tokenizer are read when asked for. Raises CheckpointError."""
    config = checked_config(path)
    if is_gguf(path):
        from argosy.engine.gguf.loader import GGUFCheckpoint

        return GGUFCheckpoint(str(path), config)
    return HFCheckpoint(str(path), config)


def load_model(checkpoint: Checkpoint, config: EngineConfig, device: torch.device, dtype: torch.dtype,
               platform: Platform) -> LlamaForCausalLM:
    """The model on device in dtype, its weights loaded, tuned by the platform; in eval mode."""
    if is_gguf(checkpoint.path):  # quantized weights stay in their blocks on the CPU (engine/gguf/loader.py)
        from argosy.engine.gguf.loader import build_gguf_model

        model = build_gguf_model(checkpoint.path, checkpoint.config, device, dtype, platform.place_weights)
    else:
        with torch.device("meta"):
            model = LlamaForCausalLM(checkpoint.config)
        model = materialize(model, device, dtype)
        platform.place_weights(model)
        # materialize left the rotary frequencies unfilled; they stay float32 in any model dtype.
        model.inv_freq = rope_inv_freq(checkpoint.config).to(device)
        model.load_weights(checkpoint.weights(device))
    if config.quantization:
        from argosy.engine.quantize import quantize_linears

        quantize_linears(model, config.quantization, device, dtype)
    platform.tune_model(model, config, dtype)
    return model.eval()
