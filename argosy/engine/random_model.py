"""Writes small random-weight Hugging Face checkpoints: for tests, benchmarks and `argosy make-test-model`.

A test helper, shipped in the package so that `argosy make-test-model` (and a user's own tests) can
build a checkpoint without a model hub; the engine never imports it. Its outputs are noise by design.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}

# Sizes: "tiny" for unit tests, "small" (~19M parameters) and "125m" for benchmarks.
PRESETS = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "small": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
                  num_key_value_heads=2),
    "125m": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=12),
}


def make_random_model(
    folder: str | Path,
    arch: str = "llama",
    size: str = "tiny",
    vocab_size: int = 512,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = False,
    rope_scaling: dict | None = None,
    init_std: float = 0.02,
    seed: int = 0,
    **overrides,
) -> Path:
    """Builds config.json, model.safetensors and a trained byte-level BPE tokenizer with a chat template.

    `init_std` is the weights' standard deviation; tests raise it so that greedy choices are not
    near-ties that float rounding could flip.
    """
    from argosy.engine.bpe_builder import build_test_tokenizer
    from argosy.engine.tokenizer import Tokenizer

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose from {', '.join(ARCHITECTURES)}")
    if size not in PRESETS:
        raise ValueError(f"unknown size {size!r}; choose from {', '.join(PRESETS)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_test_tokenizer(folder, vocab_size=vocab_size)
    tok = Tokenizer.from_pretrained(folder)
    # The model's vocabulary may be padded past the tokenizer's (as real checkpoints often are), so a
    # benchmark can ask for a realistic LM-head size whatever the small training text yields.
    vocab = max(tok.vocab_size, vocab_size)
    dims = {**PRESETS[size], **overrides}
    hidden, inter = dims["hidden_size"], dims["intermediate_size"]
    heads, kv_heads = dims["num_attention_heads"], dims["num_key_value_heads"]
    head_dim = dims.get("head_dim", hidden // heads)
    architecture, model_type = ARCHITECTURES[arch]
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": dims["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "torch_dtype": "float32",
        "attention_bias": False,
    }
    if rope_scaling:
        config["rope_scaling"] = rope_scaling
    if arch == "qwen2":
        config["use_sliding_window"] = False
    if arch == "mistral":
        config["sliding_window"] = None
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": tok.bos_token_id, "eos_token_id": sorted(tok.eos_token_ids)}, indent=2))

    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * init_std

    def norm(dim: int) -> torch.Tensor:  # near 1, but not exactly, so a norm applied wrongly shows
        return 1.0 + 0.1 * torch.randn(dim, generator=g)

    q, kv = heads * head_dim, kv_heads * head_dim
    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rand(vocab, hidden)}
    for i in range(dims["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = rand(q, hidden)
        w[p + "self_attn.k_proj.weight"] = rand(kv, hidden)
        w[p + "self_attn.v_proj.weight"] = rand(kv, hidden)
        w[p + "self_attn.o_proj.weight"] = rand(hidden, q)
        if arch == "qwen2":
            for name, size_ in (("q", q), ("k", kv), ("v", kv)):
                w[p + f"self_attn.{name}_proj.bias"] = rand(size_)
        if arch == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(head_dim)
            w[p + "self_attn.k_norm.weight"] = norm(head_dim)
        w[p + "mlp.gate_proj.weight"] = rand(inter, hidden)
        w[p + "mlp.up_proj.weight"] = rand(inter, hidden)
        w[p + "mlp.down_proj.weight"] = rand(hidden, inter)
        w[p + "input_layernorm.weight"] = norm(hidden)
        w[p + "post_attention_layernorm.weight"] = norm(hidden)
    w["model.norm.weight"] = norm(hidden)
    if not tie_word_embeddings:
        w["lm_head.weight"] = rand(vocab, hidden)
    save_file({k: v.contiguous() for k, v in w.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder
