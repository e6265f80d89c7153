"""Decode steps of a quantized model on the CPU in one C call each: every layer in one OpenMP region.

A step that decodes one sequence spent more time dispatching PyTorch ops (a dozen per layer) than
reading its Q4 weights; csrc/quant_decode.c runs the whole stack of layers for that one token in one
OpenMP region. A step of several decodes with bfloat16 batch products (quant_batch_dtype) goes to
csrc/quant_decode_batch.c the same way: layer by layer, a quarter of a 16-decode step went outside the
products and attention. Installed by the GGUF loader and by `--quantization` on models where every
projection is quantized (Llama, Mistral, Qwen2 without biases; not Qwen3's q/k norms, nor a sliding
window); steps with a prefill, two decodes, float32 or int8 batch products go to the model's own
forward. ARGOSY_QUANT_DECODE=0 turns both off.
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

from argosy.engine import quant_kernels
from argosy.engine.quant_kernels import QuantTensor
from argosy.engine.quant_linear import QuantLinear

logger = logging.getLogger(__name__)

PLAN_FIELDS = 24  # per layer, as csrc/quant_decode.c reads them


def _segments(module: nn.Module, most: int) -> list[QuantTensor] | None:
    if not isinstance(module, QuantLinear) or module.bias is not None or len(module.segments) > most:
        return None
    segs = module.segments
    return segs if all(isinstance(s, QuantTensor) for s in segs) else None


def _layer_plan(layer: nn.Module) -> list[int] | None:
    attn, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = _segments(attn.qkv_proj, 3), _segments(mlp.gate_up_proj, 2)
    o, down = _segments(attn.o_proj, 1), _segments(mlp.down_proj, 1)
    if None in (qkv, gate_up, o, down) or attn.q_norm is not None:
        return None
    norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
    if any(w.dtype != torch.float32 or not w.is_contiguous() for w in norms):
        return None
    plan = [norms[0].data_ptr(), norms[1].data_ptr(), 0, len(qkv)]
    for i in range(3):
        plan += [qkv[i].qtype, qkv[i].data.data_ptr(), qkv[i].rows] if i < len(qkv) else [0, 0, 0]
    plan += [o[0].qtype, o[0].data.data_ptr(), len(gate_up)]
    for i in range(2):
        plan += [gate_up[i].qtype, gate_up[i].data.data_ptr(), gate_up[i].rows] if i < len(gate_up) else [0, 0, 0]
    plan += [down[0].qtype, down[0].data.data_ptr()]
    return plan


class OneCallDecoder:
    """A model's decode steps as one C call each: one token (quant_decode.c), or 3+ decodes (quant_decode_batch.c)."""

    def __init__(self, model: nn.Module, plans: list[list[int]]):
        self.model, self.cfg = model, model.cfg
        self.plan = torch.tensor(plans, dtype=torch.int64)
        self.kv_key: int | None = None
        self._batches_ok: bool | None = None

    def _bind_caches(self, kv_caches) -> None:
        if self.kv_key != kv_caches[0].data_ptr():  # the caches are made after the model: their addresses here
            for i, cache in enumerate(kv_caches):
                if cache.dtype != torch.float32 or not cache.is_contiguous():
                    raise ValueError("the quantized decode paths need float32 contiguous KV caches")
                self.plan[i, 2] = cache.data_ptr()
            self.kv_key = kv_caches[0].data_ptr()

    def takes_batch(self, input_ids, meta) -> bool:
        """Whether a step is for decode_batch: 3+ decodes in one group the C attention kernel built (each
        with its own length), and every weight's batch products in bfloat16, as the layers would take them."""
        if input_ids.numel() < 3 or meta.prefills or len(meta.decode_groups) != 1:
            return False
        group = meta.decode_groups[0]
        if group.context_lens is None or group.start != 0 or group.count != input_ids.numel():
            return False
        if self._batches_ok is None:  # quant_batch_dtype is set on the layers after this path is installed
            self._batches_ok = quant_kernels.bf16_products_available() and not quant_kernels.int8_activations() \
                and all(seg.qtype in linear.bf16_batch_types for layer in self.model.layers
                        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                                       layer.mlp.down_proj) for seg in linear.segments)
        return self._batches_ok

    def decode_batch(self, input_ids, positions, kv_caches, meta) -> torch.Tensor:
        self._bind_caches(kv_caches)
        cfg, group = self.cfg, meta.decode_groups[0]
        x = self.model.embed_tokens(input_ids).float().contiguous()
        freqs = positions.unsqueeze(-1).float() * self.model.inv_freq
        cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()
        tables, lens = group.block_table.contiguous(), group.context_lens.contiguous()
        slots, cache = meta.slot_mapping.contiguous(), kv_caches[0]
        rc = quant_kernels._library().quant_decode_batch(
            cfg.num_layers, self.plan.data_ptr(), x.data_ptr(), x.shape[0], cfg.hidden_size, cfg.num_heads,
            cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size, cfg.rms_norm_eps, cos.data_ptr(), sin.data_ptr(),
            tables.data_ptr(), tables.shape[1], lens.data_ptr(), slots.data_ptr(), cache.shape[2], cache.shape[1],
            cfg.head_dim ** -0.5, torch.get_num_threads())
        if rc:
            raise MemoryError("batched quantized decode: out of memory") if rc == -2 else \
                IndexError("batched quantized decode: bad slot, length or block table")
        return self.model.norm(x)

    def __call__(self, input_ids, positions, kv_caches, meta) -> torch.Tensor:
        self._bind_caches(kv_caches)
        cfg, group = self.cfg, meta.decode_groups[0]
        x = self.model.embed_tokens(input_ids).float().contiguous()
        freqs = positions.float().unsqueeze(-1) * self.model.inv_freq
        cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()
        table = group.block_table[0].contiguous()
        ctx = int(group.context_lens[0]) if group.context_lens is not None else group.context_len
        cache = kv_caches[0]
        rc = quant_kernels._library().quant_decode_layers(
            cfg.num_layers, self.plan.data_ptr(), x.data_ptr(), cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
            cfg.head_dim, cfg.intermediate_size, cfg.rms_norm_eps, cos.data_ptr(), sin.data_ptr(), table.data_ptr(),
            ctx, int(meta.slot_mapping[0]), cache.shape[2], cache.shape[1], cfg.head_dim ** -0.5,
            torch.get_num_threads(), int(quant_kernels.int8_activations()))
        if rc:
            raise MemoryError("quantized decode: out of memory") if rc == -2 else IndexError("quantized decode: "
                                                                                              "bad slot or block table")
        return self.model.norm(x)


def install_one_call_decode(model: nn.Module) -> bool:
    """Routes the model's decode steps to csrc/quant_decode.c (one token) and quant_decode_batch.c (3+ decodes,
    bfloat16 batches) where they can take them; False, and the model unchanged, where not."""
    if os.environ.get("ARGOSY_QUANT_DECODE", "1") == "0" or not quant_kernels.available():
        return False
    cfg = model.cfg
    if cfg.sliding_window is not None or cfg.hidden_size % 32 or cfg.intermediate_size % 32:
        return False
    plans = [_layer_plan(layer) for layer in model.layers]
    if any(p is None for p in plans) or model.norm.weight.device.type != "cpu":
        return False
    decoder = OneCallDecoder(model, plans)
    layer_by_layer = model.forward

    def forward(input_ids, positions, kv_caches, meta):
        if input_ids.numel() == 1 and not meta.prefills and len(meta.decode_groups) == 1:
            return decoder(input_ids, positions, kv_caches, meta)
        if decoder.takes_batch(input_ids, meta):
            return decoder.decode_batch(input_ids, positions, kv_caches, meta)
        return layer_by_layer(input_ids, positions, kv_caches, meta)

    model.forward = forward
    logger.info("decode steps run all %d layers in one C call (csrc/quant_decode.c, quant_decode_batch.c)",
                cfg.num_layers)
    return True
