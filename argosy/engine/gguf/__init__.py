"""GGUF checkpoints (llama.cpp's single-file format): config, tokenizer and weights (docs/gguf.md)."""

from argosy.engine.gguf.file import is_gguf

__all__ = ["is_gguf"]
