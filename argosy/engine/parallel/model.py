"""One rank's shard of a Llama-family model: its pipeline stage's layers, its heads and its slice of
the MLP and the vocabulary; and the loader that reads only that shard from the safetensors files."""

from __future__ import annotations

from dataclasses import replace

import torch
from safetensors import safe_open
from torch import nn

from argosy.engine.attention import AttentionMetadata
from argosy.engine.checkpoint import ModelConfig, safetensors_files
from argosy.engine.models.llama import DecoderLayer, RMSNorm, rope_inv_freq
from argosy.engine.parallel.linear import ParallelLMHead, RowParallelLinear, VocabParallelEmbedding
from argosy.engine.parallel.split import tp_split_problems
from argosy.engine.parallel.state import ParallelState


def check_divisible(cfg: ModelConfig, tp: int, pp: int) -> None:
    """Raises ValueError, before any process starts, for a model these sizes cannot split."""
    problems = tp_split_problems(cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size, tp)
    if problems:
        raise ValueError(f"tensor_parallel_size {tp} must divide {', '.join(problems)}")
    if pp > cfg.num_layers:
        raise ValueError(f"pipeline_parallel_size {pp} exceeds the model's {cfg.num_layers} layers")


def local_config(cfg: ModelConfig, tp: int) -> ModelConfig:
    """The config one tensor-parallel rank's layers are built from. With fewer KV heads than ranks,
    each rank keeps one KV head, replicated across the ranks whose query heads use it."""
    return replace(cfg, num_heads=cfg.num_heads // tp, num_kv_heads=max(1, cfg.num_kv_heads // tp),
                   intermediate_size=cfg.intermediate_size // tp)


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    return range(stage * num_layers // pp, (stage + 1) * num_layers // pp)


class ShardedLlama(nn.Module):
    def __init__(self, cfg: ModelConfig, ps: ParallelState):
        super().__init__()
        self.cfg, self.ps = cfg, ps
        local = local_config(cfg, ps.tp_size)
        self.layer_ids = stage_layers(cfg.num_layers, ps.pp_size, ps.pp_rank)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, ps) if ps.is_first_stage else None
        self.layers = nn.ModuleList(DecoderLayer(local) for _ in self.layer_ids)
        if ps.tp_size > 1:
            for layer in self.layers:  # the two output projections sum their partial products over the ranks
                layer.self_attn.o_proj = RowParallelLinear(local.num_heads * cfg.head_dim, cfg.hidden_size, False, ps)
                layer.mlp.down_proj = RowParallelLinear(local.intermediate_size, cfg.hidden_size, cfg.mlp_bias, ps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if ps.is_last_stage else None
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, ps) if ps.is_last_stage else None
        if self.lm_head is not None and self.embed_tokens is not None and cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight  # same vocabulary split: the same shard
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                meta: AttentionMetadata, x: torch.Tensor | None = None) -> torch.Tensor:
        """x: the previous stage's output (None on the first stage). Returns this stage's output; on
        the last stage the final (normed) hidden states."""
        freqs = positions.unsqueeze(-1).float() * self.inv_freq
        dtype = self.layers[0].input_layernorm.weight.dtype
        cos, sin = freqs.cos().to(dtype).unsqueeze(1), freqs.sin().to(dtype).unsqueeze(1)
        if self.embed_tokens is not None:
            x = self.embed_tokens(input_ids)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, cos, sin, kv_cache, meta)
        return self.norm(x) if self.norm is not None else x


def load_shard(model: ShardedLlama, folder: str) -> None:
    """Reads this rank's rows/columns of each tensor with get_slice: a whole tensor is never materialized."""
    cfg, ps = model.cfg, model.ps
    tp, r = ps.tp_size, ps.tp_rank
    hd, local = cfg.head_dim, local_config(cfg, tp)
    q, kv, inter = local.num_heads * hd, local.num_kv_heads * hd, local.intermediate_size
    # The KV head(s) this rank's query heads read (with fewer KV heads than ranks, shared by several ranks).
    kv_start = (r * local.num_heads) // (cfg.num_heads // cfg.num_kv_heads) * hd
    # HF name -> (target in the merged module, offset there, split dim or None, first index in the source).
    layer_rules = {
        "self_attn.q_proj": ("self_attn.qkv_proj", 0, 0, r * q, q),
        "self_attn.k_proj": ("self_attn.qkv_proj", q, 0, kv_start, kv),
        "self_attn.v_proj": ("self_attn.qkv_proj", q + kv, 0, kv_start, kv),
        "self_attn.o_proj": ("self_attn.o_proj", 0, 1, r * q, q),
        "mlp.gate_proj": ("mlp.gate_up_proj", 0, 0, r * inter, inter),
        "mlp.up_proj": ("mlp.gate_up_proj", inter, 0, r * inter, inter),
        "mlp.down_proj": ("mlp.down_proj", 0, 1, r * inter, inter),
    }
    params = dict(model.named_parameters())
    for p in params.values():
        p.data.zero_()  # vocabulary padding rows stay zero
    expected = {(n, o) for n in params for o in ((0, q, q + kv) if "qkv_proj" in n else
                                                  (0, inter) if "gate_up_proj" in n else (0,))}
    loaded: set[tuple[str, int]] = set()

    def plan(name: str) -> list[tuple[str, int, int | None, int, int]]:
        """Where this rank puts its part of checkpoint tensor `name` (an empty list: not on this rank)."""
        parts = name.removeprefix("model.").split(".")
        if "rotary_emb" in name:
            return []
        if parts[0] == "layers":
            i = int(parts[1])
            if i not in model.layer_ids:
                return []
            prefix, module, kind = f"layers.{i - model.layer_ids.start}.", ".".join(parts[2:-1]), parts[-1]
            if module not in layer_rules:  # norms: whole on every rank
                return [(prefix + ".".join(parts[2:]), 0, None, 0, 0)]
            target, offset, dim, first, size = layer_rules[module]
            if kind == "bias" and dim == 1:  # a row-parallel bias is added once, after the all-reduce
                dim = None
            return [(f"{prefix}{target}.{kind}", offset, dim, first, size)]
        vocab = model.embed_tokens if model.embed_tokens is not None else model.lm_head
        rows = (0, 0, vocab.start, vocab.rows) if vocab is not None else None
        out = []
        if name == "model.embed_tokens.weight":
            if model.embed_tokens is not None:
                out.append(("embed_tokens.weight", *rows))
            if model.lm_head is not None and cfg.tie_word_embeddings and "lm_head.weight" in params:
                out.append(("lm_head.weight", *rows))  # tied, on another stage: its own copy of the shard
        elif name == "lm_head.weight":
            if model.lm_head is not None and not cfg.tie_word_embeddings:
                out.append(("lm_head.weight", *rows))
        elif name == "model.norm.weight":
            if model.norm is not None:
                out.append(("norm.weight", 0, None, 0, 0))
        else:
            raise ValueError(f"unexpected weight {name!r} in checkpoint")
        return out

    for path in safetensors_files(folder):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                for target, offset, dim, first, size in plan(name):
                    if target not in params:
                        raise ValueError(f"unexpected weight {name!r} in checkpoint")
                    sl = f.get_slice(name)
                    part = sl[:] if dim is None else sl[first:first + size] if dim == 0 else sl[:, first:first + size]
                    dest = params[target].data
                    if dim == 0:
                        dest = dest.narrow(0, offset, part.shape[0])
                    if dest.shape != part.shape:
                        raise ValueError(f"weight {name!r}: this rank's part has shape {tuple(part.shape)}, "
                                         f"expected {tuple(dest.shape)}")
                    dest.copy_(part)
                    loaded.add((target, offset))
    missing = sorted(f"{n}[{o}:]" if o else n for n, o in expected - loaded)
    if missing:
        raise ValueError(f"checkpoint is missing weights: {', '.join(missing[:8])}")
