"""The checked config of any checkpoint: a Hugging Face folder or a .gguf file. Read without torch, so that
the engine's loader and the fleet (before it starts a replica) check a checkpoint the same way."""

from __future__ import annotations

import os

from argosy.engine.checkpoint import ModelConfig, check_layer_count, load_model_config
from argosy.engine.gguf.file import gguf_model_config, is_gguf


def checked_config(path: str | os.PathLike) -> ModelConfig:
    """The model config, after the checks that name what is wrong with a bad checkpoint (a missing folder or
    config.json, layers its weights do not hold, a GGUF file cut short). Raises CheckpointError."""
    if is_gguf(path):
        return gguf_model_config(path)
    config = load_model_config(path)
    check_layer_count(path, config)
    return config
