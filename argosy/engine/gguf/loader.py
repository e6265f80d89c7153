"""Builds the Llama-family model from a GGUF file: quantized weights kept in their blocks on the CPU.

On the CPU in float32 (with the C kernels built), every projection whose GGUF tensors have a kernel
(Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, F16, BF16) becomes a QuantLinear over the file's own blocks, and a quantized
token embedding a QuantEmbedding (shared with the output layer when they are tied). Everything else,
and everything on CUDA or in another dtype, is dequantized (by the `gguf` package, exactly as GGML
does) and loaded like a Hugging Face checkpoint's float weights: on CUDA that means bfloat16.

llama.cpp's converter permutes the rows of q and k for llama-architecture files (its RoPE rotates
adjacent pairs where Hugging Face's rotates halves); the loader puts the rows back, whole rows at a
time, so quantized blocks move unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from argosy.engine import quant_kernels
from argosy.engine.checkpoint import CheckpointError, ModelConfig
from argosy.engine.gguf.file import PERMUTED_QK, architecture, open_gguf, release_mappings
from argosy.engine.models.llama import LlamaForCausalLM, rope_inv_freq
from argosy.engine.models.skeleton import materialize
from argosy.engine.quant_decode import install_one_call_decode
from argosy.engine.quant_kernels import KERNEL_TYPES, QuantTensor
from argosy.engine.quant_linear import QuantEmbedding, QuantLinear

_LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
# Merged projections of the model: (module path in a layer, its GGUF parts in row order)
_MERGED = (("self_attn.qkv_proj", ("attn_q", "attn_k", "attn_v")), ("self_attn.o_proj", ("attn_output",)),
           ("mlp.gate_up_proj", ("ffn_gate", "ffn_up")), ("mlp.down_proj", ("ffn_down",)))


def hf_name(name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor (None for one the model does not take, e.g. rope_freqs)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def _unpermute_index(rows: int, heads: int) -> torch.Tensor:
    # The converter's row (h, i, j) (i < head_dim / 2, j < 2) is Hugging Face's row (h, j, i).
    return torch.arange(rows).view(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)


class GGUFWeights:
    """The tensors of one GGUF file by name, read as float32 or as QuantTensors (one copy each)."""

    def __init__(self, path: str | os.PathLike, cfg: ModelConfig, reader: Any = None):
        self.path = path
        self.reader = reader if reader is not None else open_gguf(path)
        self.arch = architecture(self.reader, path)
        self.cfg = cfg
        self.tensors = {t.name: t for t in self.reader.tensors}

    def tensor(self, name: str) -> Any:
        t = self.tensors.get(name)
        if t is None:
            raise CheckpointError(f"{self.path}: GGUF file lacks tensor {name!r}")
        return t

    def _permutation(self, name: str) -> torch.Tensor | None:
        if self.arch not in PERMUTED_QK:
            return None
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        heads = {"attn_q": self.cfg.num_heads, "attn_k": self.cfg.num_kv_heads}.get(kind)
        if heads is None:
            return None
        rows = int(self.tensor(name).shape[-1])
        if rows % (2 * heads):
            raise CheckpointError(f"{self.path}: tensor {name!r} has {rows} rows, not a whole number of heads "
                                  f"({heads}) of even size")
        return _unpermute_index(rows, heads)

    def has_kernel(self, name: str) -> bool:
        t = self.tensor(name)
        kind = KERNEL_TYPES.get(int(t.tensor_type))
        # A block type's rows are whole blocks by construction; an F16 or BF16 row may be any width, and the
        # kernels take it in runs of 32 (one that is not stays float32, as before).
        return kind is not None and len(t.shape) == 2 and int(t.shape[0]) % kind[1] == 0

    def quant(self, name: str) -> QuantTensor:
        t = self.tensor(name)
        raw = np.ascontiguousarray(t.data)  # blocks as bytes; an F16 tensor is read as float16 values
        data = torch.from_numpy(raw.view(np.uint8).reshape(raw.shape[0], -1).copy())
        perm = self._permutation(name)
        if perm is not None:
            data = data.index_select(0, perm)
        return QuantTensor(int(t.tensor_type), data, int(t.shape[0]))

    def float32(self, name: str) -> torch.Tensor:
        import gguf

        t = self.tensor(name)
        kind = t.tensor_type.name
        if kind == "F32":
            array = np.array(t.data, dtype=np.float32)  # a copy out of the mapping
        elif kind == "F16":
            array = t.data.astype(np.float32)
        else:
            array = gguf.quants.dequantize(t.data, t.tensor_type)
        tensor = torch.from_numpy(array.reshape(tuple(int(d) for d in reversed(t.shape))))
        perm = self._permutation(name)
        return tensor if perm is None else tensor.index_select(0, perm)

    def float_weights(self, skip: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
        for name in self.tensors:
            target = hf_name(name)
            if target is not None and name not in skip:
                yield target, self.float32(name)

    def rope_divisors(self) -> torch.Tensor | None:
        """Llama 3's frequency-dependent RoPE scaling, stored by the converter as a tensor of divisors."""
        return self.float32("rope_freqs.weight") if "rope_freqs.weight" in self.tensors else None


def _quant_linear(names: list[str], segs: list, old: torch.nn.Linear, bias: torch.Tensor | None) -> QuantLinear:
    """The QuantLinear standing for `old`, or a CheckpointError naming the tensors whose shapes do not fit
    the model's config (the float path's load_weights checks the same; kept blocks must be checked here)."""
    try:
        layer = QuantLinear(old.in_features, segs, bias)
    except ValueError as e:
        raise CheckpointError(f"GGUF tensors {', '.join(names)}: {e}") from None
    if layer.out_features != old.out_features:
        raise CheckpointError(f"GGUF tensors {', '.join(names)} have {layer.out_features} rows in all, where the "
                              f"model's config needs {old.out_features}")
    return layer


def _keep_quantized(model: LlamaForCausalLM, weights: GGUFWeights) -> set[str]:
    """Puts QuantLinear/QuantEmbedding modules where the file's tensors have a kernel; returns their names."""
    taken: set[str] = set()

    def segments(names: list[str]) -> list[QuantTensor | torch.Tensor] | None:
        if not any(weights.has_kernel(n) for n in names):
            return None
        taken.update(names)
        return [weights.quant(n) if weights.has_kernel(n) else weights.float32(n) for n in names]

    for i, layer in enumerate(model.layers):
        for path, parts in _MERGED:
            names = [f"blk.{i}.{p}.weight" for p in parts]
            segs = segments(names)
            if segs is None:
                continue
            parent_name, attr = path.split(".")
            parent = getattr(layer, parent_name)
            old = getattr(parent, attr)
            bias = None if old.bias is None else torch.empty_like(old.bias)  # filled by load_weights
            setattr(parent, attr, _quant_linear(names, segs, old, bias))
    embed = "token_embd.weight"
    if weights.has_kernel(embed):
        table = weights.quant(embed)
        if (table.rows, table.cols) != tuple(model.embed_tokens.weight.shape):
            raise CheckpointError(f"GGUF tensor {embed} is {table.rows} x {table.cols}, where the model's config "
                                  f"needs {tuple(model.embed_tokens.weight.shape)}")
        taken.add(embed)
        model.embed_tokens = QuantEmbedding(table)
        if model.cfg.tie_word_embeddings:
            model.lm_head = QuantLinear(table.cols, [table])
    if not model.cfg.tie_word_embeddings and (segs := segments(["output.weight"])) is not None:
        model.lm_head = _quant_linear(["output.weight"], segs, model.lm_head, None)
    return taken


@dataclass(frozen=True)
class GGUFCheckpoint:
    """A GGUF file (engine/loader.py's Checkpoint): config and tokenizer from its metadata; its weights as
    float tensors with Hugging Face names (dequantized), for callers that want them so."""

    path: str
    config: ModelConfig

    def weights(self, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
        return ((name, t.to(device)) for name, t in GGUFWeights(self.path, self.config).float_weights(set()))

    def tokenizer(self):
        from argosy.engine.gguf.tokenizer import gguf_tokenizer

        return gguf_tokenizer(self.path)


def build_gguf_model(path: str | os.PathLike, cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                     place_weights: Callable[[torch.nn.Module], Any] | None = None) -> LlamaForCausalLM:
    weights = GGUFWeights(path, cfg)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    taken: set[str] = set()
    if device.type == "cpu" and dtype == torch.float32 and quant_kernels.available():
        taken = _keep_quantized(model, weights)
    model = materialize(model, device, dtype)
    if place_weights is not None:
        place_weights(model)
    inv_freq = rope_inv_freq(cfg)
    divisors = weights.rope_divisors()
    model.inv_freq = (inv_freq if divisors is None else inv_freq / divisors).to(device)
    model.load_weights((name, t.to(device)) for name, t in weights.float_weights(taken))
    del weights
    release_mappings()  # everything is copied out: the mapping's pages need not stay resident
    if taken:
        install_one_call_decode(model)
    return model
