"""Fleet pieces for encoder components (models of kind embed or rerank): memory need, kind checks.

An encoder replica holds its weights and one batch's activations, and no KV cache: on a GPU it asks for a
share of one (several encoder replicas fit on a GPU), not a whole one as an LLM replica does.
"""

from __future__ import annotations

import json
from pathlib import Path

from argosy.config import EngineSection, ModelConfig
from argosy.encoder.config import CPU_BATCH_TOKENS, CUDA_BATCH_TOKENS
from argosy.fleet.placement import CPU_OVERHEAD_GIB, DTYPE_BYTES, GIB, GPU_OVERHEAD_GIB, Need

ACTIVATION_FLOATS_PER_TOKEN = 24  # per hidden unit: a layer's q/k/v, MLP and norm temporaries, with slack


def encoder_parameter_count(cfg: dict) -> int:
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    per_layer = 4 * h * h + 2 * h * inter + 9 * h + inter
    emb = (cfg["vocab_size"] + cfg.get("max_position_embeddings", 512) + cfg.get("type_vocab_size", 2)) * h
    return layers * per_layer + emb + h * h + h  # + the pooler


def encoder_need(checkpoint: str | Path, engine: EngineSection, on_gpu: bool) -> Need:
    cfg = json.loads((Path(checkpoint) / "config.json").read_text())
    dtype = engine.dtype if engine.dtype != "auto" else ("float32" if not on_gpu else cfg.get("torch_dtype", "float32"))
    size = DTYPE_BYTES.get(str(dtype), 4)
    weights = encoder_parameter_count(cfg) * size / GIB
    tokens = engine.max_num_batched_tokens or (CUDA_BATCH_TOKENS if on_gpu else CPU_BATCH_TOKENS)
    activations = tokens * cfg["hidden_size"] * ACTIVATION_FLOATS_PER_TOKEN * size / GIB
    if on_gpu:
        return Need(1, round(weights + activations + GPU_OVERHEAD_GIB, 3))
    return Need(0, round(weights + activations + CPU_OVERHEAD_GIB, 3))


def checkpoint_kind(checkpoint: str | Path) -> str:
    """generate, embed or rerank: what the checkpoint folder can serve."""
    from argosy.encoder.checkpoint import is_encoder_checkpoint, load_encoder_spec

    if not is_encoder_checkpoint(checkpoint):
        return "generate"
    return load_encoder_spec(checkpoint).kind


def kind_mismatch(m: ModelConfig) -> str | None:
    """One line when a managed model's checkpoint cannot serve its kind, else None."""
    try:
        actual = checkpoint_kind(m.checkpoint)
    except ValueError as e:
        return f"model {m.name!r}: {e}"
    if actual == m.kind:
        return None
    what = {"generate": "a generative model", "embed": "an embedding model", "rerank": "a cross-encoder reranker"}
    return (f"model {m.name!r}: its checkpoint is {what[actual]}, but the fleet file says kind {m.kind}; "
            f"set kind: {actual}")
