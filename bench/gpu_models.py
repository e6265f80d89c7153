"""Random-weight models for bench/gpu_check.py, built straight on the device (no 16 GB file to write and
read back): a checkpoint folder holding only config.json and a small tokenizer, and the weights as a dict
of Hugging Face-named tensors that both Argosy (through an in-memory Checkpoint) and transformers load."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

LLAMA_31_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
                   rope_theta=500000.0, rms_norm_eps=1e-5,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=2048, max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-6)
PROMPT_VOCAB = 500  # prompts use ids the small tokenizer has; the model's vocabulary is padded past it


def checkpoint_folder(folder: Path, dims: dict, dtype: torch.dtype) -> Path:
    """config.json for these dimensions and a trained 512-token BPE tokenizer (no weights)."""
    from argosy.engine.bpe_builder import build_test_tokenizer
    from argosy.engine.tokenizer import Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    build_test_tokenizer(folder, vocab_size=512)
    tok = Tokenizer.from_pretrained(folder)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
              "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
              "torch_dtype": str(dtype).removeprefix("torch."), **dims}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def random_weights(dims: dict, dtype: torch.dtype, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """HF-named weights, normal(0, 0.02) as transformers initialises them; norms at 1."""
    gen = torch.Generator(device).manual_seed(seed)
    hidden, inter, vocab = dims["hidden_size"], dims["intermediate_size"], dims["vocab_size"]
    q, kv = dims["num_attention_heads"] * dims["head_dim"], dims["num_key_value_heads"] * dims["head_dim"]

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * 0.02).to(dtype)

    w = {"model.embed_tokens.weight": rand(vocab, hidden)}
    for i in range(dims["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, shape in (("self_attn.q_proj", (q, hidden)), ("self_attn.k_proj", (kv, hidden)),
                            ("self_attn.v_proj", (kv, hidden)), ("self_attn.o_proj", (hidden, q)),
                            ("mlp.gate_proj", (inter, hidden)), ("mlp.up_proj", (inter, hidden)),
                            ("mlp.down_proj", (hidden, inter))):
            w[p + name + ".weight"] = rand(*shape)
        w[p + "input_layernorm.weight"] = torch.ones(hidden, dtype=dtype, device=device)
        w[p + "post_attention_layernorm.weight"] = torch.ones(hidden, dtype=dtype, device=device)
    w["model.norm.weight"] = torch.ones(hidden, dtype=dtype, device=device)
    w["lm_head.weight"] = rand(vocab, hidden)
    return w


@dataclass
class MemoryCheckpoint:
    """An Argosy Checkpoint over weights already on the device. Loading takes them out of the dict, so
    each is freed once the engine has copied it."""

    path: str
    config: object
    tensors: dict[str, torch.Tensor]

    def weights(self, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
        while self.tensors:
            name = next(iter(self.tensors))
            yield name, self.tensors.pop(name).to(device)

    def tokenizer(self):
        from argosy.engine.tokenizer import Tokenizer

        return Tokenizer.from_pretrained(self.path)


def memory_checkpoint(folder: Path, tensors: dict[str, torch.Tensor]) -> MemoryCheckpoint:
    from argosy.engine.checkpoint import load_model_config

    return MemoryCheckpoint(str(folder), load_model_config(folder), tensors)


def transformers_model(folder: Path, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device):
    """transformers' LlamaForCausalLM over the same tensors (assigned, not copied)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.load_state_dict(tensors, strict=True, assign=True)
    return model.eval()


def weight_bytes_per_step(dims: dict, dtype: torch.dtype) -> int:
    """Bytes of weights a decode step reads: every matrix but the embedding table (a few rows of it)."""
    hidden, inter, vocab = dims["hidden_size"], dims["intermediate_size"], dims["vocab_size"]
    q, kv = dims["num_attention_heads"] * dims["head_dim"], dims["num_key_value_heads"] * dims["head_dim"]
    per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter + 2 * hidden
    params = dims["num_hidden_layers"] * per_layer + hidden + vocab * hidden
    return params * torch.finfo(dtype).bits // 8


def kv_bytes_per_token(dims: dict, dtype: torch.dtype) -> int:
    return 2 * dims["num_hidden_layers"] * dims["num_key_value_heads"] * dims["head_dim"] * torch.finfo(dtype).bits // 8
