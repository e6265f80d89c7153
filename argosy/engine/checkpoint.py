"""Reads a Hugging Face checkpoint folder: config.json and safetensors weights (one file or sharded)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import safe_open

if TYPE_CHECKING:  # torch is imported where weights are read: the fleet reads configs without it
    import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


_REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


class CheckpointError(ValueError):
    """The checkpoint folder is missing a file or describes a model this engine cannot run."""


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # llama3-style scaling parameters, else None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2 (and Llama's attention_bias)
    qk_norm: bool  # Qwen3
    mlp_bias: bool
    torch_dtype: str | None
    sliding_window: int | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        """A config that cannot describe a model (a hostile or corrupt file's: no heads, a NaN RoPE base, a
        BOS token outside the vocabulary) is a CheckpointError here, before any tensor is allocated, not a
        ZeroDivisionError or an IndexError at the first request."""
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CheckpointError(f"the model's {name} is {value!r}: it must be a whole number of at least 1")
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(f"the model's {self.num_heads} attention heads do not share its "
                                  f"{self.num_kv_heads} KV heads evenly")
        if self.head_dim % 2:
            raise CheckpointError(f"the model's head_dim is {self.head_dim}: RoPE needs an even one")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise CheckpointError(f"the model's {name} is {value!r}: it must be a finite number above 0")
        for name, ids in (("bos_token_id", () if self.bos_token_id is None else (self.bos_token_id,)),
                          ("eos_token_id", self.eos_token_ids)):
            bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.vocab_size]
            if bad:
                raise CheckpointError(f"the model's {name} {bad[0]!r} is not a token of its {self.vocab_size}-token "
                                      f"vocabulary")


def load_model_config(folder: str | Path) -> ModelConfig:
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"model folder {str(folder)!r} does not exist")
    path = folder / "config.json"
    if not path.exists():
        raise CheckpointError(f"{folder} has no config.json: not a Hugging Face checkpoint folder")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise CheckpointError(
            f"unsupported architecture {archs or cfg.get('model_type')!r} in {path}; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    missing = [k for k in _REQUIRED_KEYS if k not in cfg]
    if missing:
        raise CheckpointError(f"{path} lacks {', '.join(missing)}")
    # transformers 5 writes rope settings as `rope_parameters`; older checkpoints use
    # `rope_theta` + `rope_scaling`.
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    try:
        rope_theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    except (TypeError, ValueError):
        raise CheckpointError(f"{path}: rope_theta is not a number") from None
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise CheckpointError(f"unsupported rope_type {rope_type!r} in {path}; supported: default, llama3")
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    use_sliding = cfg.get("use_sliding_window", arch == "MistralForCausalLM")
    try:
        return _hf_config(cfg, arch, rope, rope_theta, rope_type, eos_ids, use_sliding)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    except (TypeError, ValueError) as e:  # e.g. a head count that is a string
        raise CheckpointError(f"{path}: a value does not describe a model ({type(e).__name__}: {e})") from None


def _hf_config(cfg: dict, arch: str, rope: dict, rope_theta: float, rope_type: str, eos_ids: tuple,
               use_sliding: bool) -> ModelConfig:
    num_heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=hidden,
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
        head_dim=cfg.get("head_dim") or (hidden // num_heads if isinstance(num_heads, int) and num_heads > 0 else 0),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope if rope_type == "llama3" else None,
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
        qk_norm=arch == "Qwen3ForCausalLM",
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        sliding_window=cfg.get("sliding_window") if use_sliding else None,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )


def safetensors_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no safetensors weights (model.safetensors or a sharded index)")
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise CheckpointError(f"{folder} is missing weight shards: {', '.join(missing)}")
    return files


def layer_count_problem(held: set[int], count: int) -> str | None:
    """Why the layer (GGUF: block) indices a checkpoint's tensors hold are not 0..count-1, or None. A config
    claiming a million layers built them all before the load found the weights missing (minutes)."""
    if held == set(range(count)):
        return None
    what = f"{min(held)}-{max(held)} ({len(held)} in all)" if held else "none"
    return f"its config gives {count} layers; its weights hold layers {what}"


def check_layer_count(folder: str | Path, cfg: ModelConfig) -> None:
    """layer_count_problem for a folder, from its safetensors headers (no tensor data is read)."""
    layers: set[int] = set()
    for path in safetensors_files(folder):
        with safe_open(str(path), framework="numpy") as f:  # only the header's names are read
            layers.update(int(p[2]) for p in (name.split(".") for name in f.keys())
                          if len(p) > 3 and p[:2] == ["model", "layers"] and p[2].isdigit())
    problem = layer_count_problem(layers, cfg.num_layers)
    if problem:
        raise CheckpointError(f"{folder}: {problem}")


def iter_weights(folder: str | Path, device: torch.device | str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (name, tensor) one tensor at a time, so peak memory stays near one tensor."""
    for path in safetensors_files(folder):
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
