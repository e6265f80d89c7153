"""Opening a GGUF file (llama.cpp's format) with the `gguf` package, and the model config in its metadata.

The `gguf` package's reader memory-maps the file: tensors are numpy views of the mapping, and the
loader copies each one once, into the engine's own tensors. A file that is not GGUF, is cut short, or
describes a model or a tensor type this engine cannot run is rejected with a CheckpointError that says
which.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from argosy.engine.checkpoint import CheckpointError, ModelConfig, layer_count_problem

# GGUF architecture -> the Hugging Face architecture the engine runs. Mistral's files say "llama".
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
# Architectures whose q/k rows llama.cpp's converter permuted for its interleaved RoPE (undone at load).
PERMUTED_QK = ("llama", "mistral")
# Tensor types the loader reads: float ones, those with a CPU kernel, and Q6_K (dequantized at load).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")


def is_gguf(path: str | os.PathLike) -> bool:
    """A path names a GGUF checkpoint when it is a file ending in .gguf (a folder is a Hugging Face one)."""
    return str(path).lower().endswith(".gguf") and not Path(path).is_dir()


def open_gguf(path: str | os.PathLike) -> Any:
    """A gguf.GGUFReader over the file (reader.py's, which parses metadata arrays in one pass), after checks
    that name what is wrong with a bad one. The config, the tokenizer and the weights all read the file: it
    is parsed once while it stays unchanged."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"GGUF file {str(path)!r} does not exist")
    stat = path.stat()
    return _open(path.resolve(), stat.st_size, stat.st_mtime_ns)


def release_mappings() -> None:
    """Drops the cached readers, and with them the file mappings (whose touched pages count in the RSS)
    once every tensor has been copied out."""
    _open.cache_clear()


@functools.lru_cache(maxsize=2)
def _open(path: Path, size: int, mtime_ns: int) -> Any:
    try:
        from argosy.engine.gguf.reader import FastGGUFReader
    except ImportError:
        raise CheckpointError("reading GGUF files needs the `gguf` package: pip install gguf") from None
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise CheckpointError(f"{path} is not a GGUF file (its first bytes are {magic!r}, not b'GGUF')")
    try:
        reader = FastGGUFReader(path)
    except ValueError as e:
        text = str(e)
        if "is not a valid GGMLQuantizationType" in text:
            raise CheckpointError(f"{path}: unsupported tensor type ({text})") from None
        raise CheckpointError(f"{path} is truncated or corrupt: {text}") from None
    except (IndexError, KeyError, OverflowError, TypeError) as e:
        raise CheckpointError(f"{path} is truncated or corrupt: {type(e).__name__}: {e}") from None
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise CheckpointError(f"{path} is truncated: tensor {t.name!r} ends at byte {t.data_offset + t.n_bytes}, "
                                  f"the file has {size}")
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise CheckpointError(f"{path}: tensor {t.name!r} has type {t.tensor_type.name}, which Argosy does not "
                                  f"read (supported: {', '.join(SUPPORTED_TYPES)})")
    return reader


def field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()  # strings are decoded here, not when the file is parsed
    except (ValueError, IndexError, TypeError) as e:
        raise CheckpointError(f"GGUF metadata {key} cannot be read ({type(e).__name__}: {e})") from None


def architecture(reader: Any, path: str | os.PathLike) -> str:
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{path}: unsupported GGUF architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}")
    return arch


def gguf_model_config(path: str | os.PathLike, reader: Any = None) -> ModelConfig:
    reader = reader if reader is not None else open_gguf(path)
    arch = architecture(reader, path)

    def key(name: str, default: Any = None, required: bool = False, kind: type = int) -> Any:
        value = field(reader, f"{arch}.{name}", default)
        if value is None:
            if required:
                raise CheckpointError(f"{path}: GGUF metadata lacks {arch}.{name}")
            return None
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise CheckpointError(f"{path}: GGUF metadata {arch}.{name} is {value!r}, not a number") from None

    def token(name: str) -> int | None:
        value = field(reader, f"tokenizer.ggml.{name}_token_id")
        if value is None or isinstance(value, int) and not isinstance(value, bool):
            return value  # ModelConfig checks that it is inside the vocabulary
        raise CheckpointError(f"{path}: GGUF metadata tokenizer.ggml.{name}_token_id is {value!r}, not a token id")

    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise CheckpointError(f"{path}: no token_embd.weight tensor")
    hidden, heads = key("embedding_length", required=True), key("attention.head_count", required=True)
    values = dict(
        architecture=ARCHITECTURES[arch],
        vocab_size=key("vocab_size") or int(tensors["token_embd.weight"].shape[1]),
        hidden_size=hidden,
        intermediate_size=key("feed_forward_length", required=True),
        num_layers=key("block_count", required=True),
        num_heads=heads,
        num_kv_heads=key("attention.head_count_kv") or heads,
        head_dim=key("attention.key_length") or (hidden // heads if heads > 0 else 0),
        rms_norm_eps=key("attention.layer_norm_rms_epsilon", 1e-6, kind=float),
        rope_theta=key("rope.freq_base", 10000.0, kind=float),
        rope_scaling=None,  # llama 3 scaling comes as a rope_freqs tensor: applied by the loader
        max_position_embeddings=key("context_length", 2048),
        tie_word_embeddings="output.weight" not in tensors,
        qkv_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        mlp_bias="blk.0.ffn_up.bias" in tensors,
        torch_dtype=None,
        sliding_window=key("attention.sliding_window") or None,
        bos_token_id=token("bos"),
        eos_token_ids=() if token("eos") is None else (token("eos"),),
    )
    try:
        cfg = ModelConfig(**values)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    blocks = {int(n.split(".")[1]) for n in tensors if n.startswith("blk.") and n.split(".")[1].isdigit()}
    problem = layer_count_problem(blocks, cfg.num_layers)
    if problem:
        raise CheckpointError(f"{path}: {problem}")
    return cfg
