"""BERT in plain PyTorch over packed sequences: no padding in the linear layers.

A batch is the concatenation of its sequences' tokens ([T, hidden]); every linear layer and norm runs
on those T rows only. Attention runs per group of similar-length sequences (batch.py): one masked SDPA
call over the group padded to its longest (a plain view where the lengths are equal), its real rows
written straight back into the packed output.

Query, key and value are one fused projection ([3 * hidden, hidden]): one matrix product instead of three.
On the CPU the layers run on oneDNN with the activation and the residual add fused into the matrix
products (cpu_ops.py).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from argosy.encoder.batch import PackedBatch
from argosy.encoder.checkpoint import RERANK, BertConfig, EncoderCheckpointError, EncoderSpec
from argosy.engine.models.skeleton import materialize, unfilled_embedding

_ACTIVATIONS = {"gelu": lambda x: F.gelu(x), "relu": F.relu,
                "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
                "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        h = cfg.hidden_size
        self.num_heads, self.head_dim = cfg.num_heads, h // cfg.num_heads
        self.qkv = nn.Linear(h, 3 * h)
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.up = nn.Linear(h, cfg.intermediate_size)
        self.down = nn.Linear(cfg.intermediate_size, h)
        self.out_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.act_name = cfg.hidden_act
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.fused = None  # set by cpu_ops.use_fused_cpu_layers: forward(layer, x, batch)

    def attention(self, qkv: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        nh, d = self.num_heads, self.head_dim
        out = torch.empty(qkv.shape[0], nh * d, dtype=qkv.dtype, device=qkv.device)
        for g in batch.groups:
            rows = qkv[g.start:g.end]
            if g.gather is not None:
                rows = rows.index_select(0, g.gather)  # padded to [count * length] rows
            q, k, v = rows.view(g.count, g.length, 3, nh, d).permute(2, 0, 3, 1, 4).unbind(0)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=g.mask).transpose(1, 2)  # [count, length, nh, d]
            if g.keep is None:
                out[g.start:g.end].view(g.count, g.length, nh, d).copy_(o)
            else:
                torch.index_select(o.reshape(g.count * g.length, nh * d), 0, g.keep, out=out[g.start:g.end])
        return out

    def forward(self, x: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        if self.fused is not None:
            return self.fused(self, x, batch)
        a = self.attention(self.qkv(x), batch)
        x = self.attn_norm(self.attn_out(a) + x)
        return self.out_norm(self.down(self.act(self.up(x))) + x)


class BertEncoderModel(nn.Module):
    """Token states for a packed batch; with a classifier (cross-encoders), the logits per sequence."""

    def __init__(self, cfg: BertConfig, with_classifier: bool):
        super().__init__()
        h = cfg.hidden_size
        self.cfg = cfg
        self.word_embeddings = unfilled_embedding(cfg.vocab_size, h)
        self.position_embeddings = unfilled_embedding(cfg.max_position_embeddings, h)
        self.token_type_embeddings = unfilled_embedding(max(cfg.type_vocab_size, 1), h)
        self.embeddings_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))
        self.pooler = nn.Linear(h, h) if with_classifier else None
        self.classifier = nn.Linear(h, cfg.num_labels) if with_classifier else None

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = (self.word_embeddings(batch.input_ids) + self.token_type_embeddings(batch.token_type_ids)
             + self.position_embeddings(batch.position_ids))
        x = self.embeddings_norm(x)
        for layer in self.layers:
            x = layer(x, batch)
        return x

    def classify(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """BertForSequenceClassification's head: tanh(pooler(CLS state)) -> classifier, [B, labels]."""
        assert self.pooler is not None and self.classifier is not None
        cls = hidden.index_select(0, batch.starts)
        return self.classifier(torch.tanh(self.pooler(cls)))


# ---------------------------------------------------------------------------- weights

_LAYER = re.compile(r"encoder\.layer\.(\d+)\.(.+)")
_LAYER_PARTS = {"attention.output.dense": "attn_out", "attention.output.LayerNorm": "attn_norm",
                "intermediate.dense": "up", "output.dense": "down", "output.LayerNorm": "out_norm"}
_QKV = {"query": 0, "key": 1, "value": 2}
_TOP = {"embeddings.word_embeddings": "word_embeddings", "embeddings.position_embeddings": "position_embeddings",
        "embeddings.token_type_embeddings": "token_type_embeddings", "embeddings.LayerNorm": "embeddings_norm",
        "pooler.dense": "pooler", "classifier": "classifier"}
_LEAF = {"gamma": "weight", "beta": "bias"}  # names in checkpoints written by old TensorFlow ports


def target_of(name: str) -> tuple[str, int | None] | None:
    """Our parameter for a checkpoint tensor, with the q/k/v third it fills; None: not ours (skipped)."""
    if name.startswith("bert."):
        name = name[5:]
    module, _, leaf = name.rpartition(".")
    leaf = _LEAF.get(leaf, leaf)
    if module in _TOP:
        return f"{_TOP[module]}.{leaf}", None
    m = _LAYER.fullmatch(module)
    if m is None:
        return None
    i, part = m.groups()
    if part.startswith("attention.self."):
        which = _QKV.get(part.rsplit(".", 1)[1])
        return (f"layers.{i}.qkv.{leaf}", which) if which is not None else None
    return (f"layers.{i}.{_LAYER_PARTS[part]}.{leaf}", None) if part in _LAYER_PARTS else None


def load_model(spec: EncoderSpec, device: torch.device, dtype: torch.dtype) -> BertEncoderModel:
    from argosy.engine.checkpoint import CheckpointError, iter_weights

    with torch.device("meta"):
        model = BertEncoderModel(spec.bert, with_classifier=spec.kind == RERANK)
    model = materialize(model, device, dtype)
    params = dict(model.named_parameters())
    filled: dict[str, int] = {}
    try:
        weights = list(iter_weights(spec.folder))
    except CheckpointError as e:
        raise EncoderCheckpointError(str(e)) from None
    for name, tensor in weights:
        target = target_of(name)
        if target is None or target[0] not in params:
            continue
        pname, third = target
        p = params[pname]
        dest = p.data if third is None else p.data.chunk(3, dim=0)[third]
        if dest.shape != tensor.shape:
            raise EncoderCheckpointError(f"{spec.folder}: {name} has shape {tuple(tensor.shape)}, "
                                         f"expected {tuple(dest.shape)}")
        dest.copy_(tensor)
        filled[pname] = filled.get(pname, 0) + 1
    missing = [n for n in params if filled.get(n, 0) != (3 if ".qkv." in n else 1)]
    if missing:
        raise EncoderCheckpointError(f"{spec.folder}: the checkpoint lacks {', '.join(missing[:5])}"
                                     + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    return model.eval()
