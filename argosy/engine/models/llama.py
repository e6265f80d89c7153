"""Llama-family decoder (Llama, Mistral, Qwen2 with q/k/v bias, Qwen3 with q/k norm) over a paged KV cache."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from argosy.engine.attention import AttentionBackend, AttentionMetadata, paged_attention, write_kv
from argosy.engine.checkpoint import CheckpointError, ModelConfig
from argosy.engine.models.skeleton import unfilled_embedding


class RMSNorm(nn.Module):
    # Set by the platform where it has kernels for the model's dtype: the CPU's C RMS norm (float32),
    # CUDA's Triton ones (kernel(x, weight, eps); add_kernel(x, residual, weight, eps) -> (sum, normed)).
    kernel = None
    add_kernel = None

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, this norm of it): one pass where a fused kernel is set."""
        if self.add_kernel is not None and x.dim() == 2:
            return self.add_kernel(x, residual, self.weight, self.eps)
        summed = x + residual
        return summed, self(summed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None and x.dim() == 2:
            return self.kernel(x, self.weight, self.eps)
        # As transformers does: normalise in float32, scale in the model dtype. (F.rms_norm is several
        # times slower than these three ops on the CPU in torch 2.13.)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """The rotary frequencies [head_dim / 2], float32, on the CPU even inside a meta-device build (model
    skeletons: on meta, this arithmetic would import torch._dynamo, most of a second of a replica's start)."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    s = cfg.rope_scaling
    if s is None:
        return inv_freq
    # Llama 3.1's frequency-dependent scaling, as in transformers' _compute_llama3_parameters.
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, dim]; cos/sin: [T, 1, dim/2]. The rotate-half layout of HF checkpoints."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    rope_kernel = None  # in-place RoPE over q and k: the CPU's C one (float32) or CUDA's Triton one
    backend: AttentionBackend | None = None  # set by the runner; None: the best one for each call's cache

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        # q, k and v merged into one matmul (the checkpoint's three matrices are stacked at load).
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = cfg.head_dim ** -0.5

    def forward(self, x, cos, sin, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        v = qkv[:, self.q_size + self.kv_size:].view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k, _ = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = self.q_norm(q.view(t, self.num_heads, self.head_dim))
            k = self.k_norm(k.view(t, self.num_kv_heads, self.head_dim))
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        else:  # q and k lie side by side: one rotation for both halves the small ops of a decode step
            qk = qkv[:, :self.q_size + self.kv_size].view(t, self.num_heads + self.num_kv_heads, self.head_dim)
            if self.rope_kernel is not None:
                self.rope_kernel(qkv, cos, sin, self.num_heads + self.num_kv_heads, self.head_dim)  # in place
            else:
                qk = apply_rope(qk, cos, sin)
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        # Every new K/V is written before any attention reads the cache: a sequence may read blocks
        # that another sequence in this same batch computes (prefix hits on freshly cached blocks).
        if self.backend is None:
            write_kv(kv_cache, k, v, meta.slot_mapping)
            o = paged_attention(q, k, v, kv_cache, meta, self.scale)
        else:
            self.backend.write_kv(kv_cache, k, v, meta.slot_mapping)
            o = self.backend.forward(q, k, v, kv_cache, meta, self.scale)
        return self.o_proj(o.view(t, self.q_size))


class MLP(nn.Module):
    act_kernel = None  # SiLU(gate) * up over [rows, 2 * inter]: the CPU's C one (float32), set by the platform

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.act_kernel is not None and gate_up.dim() == 2:
            return self.down_proj(self.act_kernel(gate_up))
        gate, up = gate_up.split(self.inter, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv_cache, meta):
        attn = self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta)
        x, h = self.post_attention_layernorm.add_norm(attn, x)  # the residual add fused into the norm (CUDA)
        return x + self.mlp(h)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = unfilled_embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                meta: AttentionMetadata) -> torch.Tensor:
        """Returns the final hidden states [T, hidden] of the flattened batch."""
        freqs = positions.unsqueeze(-1).float() * self.inv_freq  # [T, dim/2]
        cos = freqs.cos().to(self.embed_tokens.weight.dtype).unsqueeze(1)
        sin = freqs.sin().to(self.embed_tokens.weight.dtype).unsqueeze(1)
        x = self.embed_tokens(input_ids)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, cos, sin, kv_cache, meta)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies HF-named tensors in, stacking q/k/v and gate/up into the merged matrices."""
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        params = dict(self.named_parameters(remove_duplicate=False))
        q, kv, inter = (self.cfg.num_heads * self.cfg.head_dim, self.cfg.num_kv_heads * self.cfg.head_dim,
                        self.cfg.intermediate_size)
        stacked = {"q_proj": ("qkv_proj", 0, q), "k_proj": ("qkv_proj", q, kv), "v_proj": ("qkv_proj", q + kv, kv),
                   "gate_proj": ("gate_up_proj", 0, inter), "up_proj": ("gate_up_proj", inter, inter)}
        expected: set[tuple[str, int]] = set()
        for pname in params:
            module = pname.split(".")[-2]
            offsets = [start for merged, start, _ in stacked.values() if merged == module]
            expected.update((pname, o) for o in (offsets or [0]))
        if self.cfg.tie_word_embeddings:
            expected.discard(("lm_head.weight", 0))
        loaded: set[tuple[str, int]] = set()
        for name, tensor in weights:
            if "rotary_emb" in name or (self.cfg.tie_word_embeddings and name == "lm_head.weight"):
                continue
            parts = name.removeprefix("model.").split(".")
            target, start, size = ".".join(parts), 0, None
            if len(parts) >= 2 and parts[-2] in stacked:
                merged, start, size = stacked[parts[-2]]
                target = ".".join(parts[:-2] + [merged, parts[-1]])
            if target not in params:
                raise CheckpointError(f"unexpected weight {name!r} in checkpoint")
            dest = params[target].data if size is None else params[target].data.narrow(0, start, size)
            if dest.shape != tensor.shape:
                raise CheckpointError(f"weight {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}")
            dest.copy_(tensor)
            loaded.add((target, start))
        missing = sorted(f"{n}[{o}:]" if o else n for n, o in expected - loaded)
        if missing:
            raise CheckpointError(f"checkpoint is missing weights: {', '.join(missing[:8])}")
