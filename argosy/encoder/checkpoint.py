"""Reads a BERT-family checkpoint folder: config.json, safetensors, and the sentence-transformers files.

Two kinds of checkpoint are served:
- an embedding model (`BertModel`): the sentence-transformers modules next to it say how token states
  become one vector (modules.json, 1_Pooling/config.json, a Normalize module, sentence_bert_config.json's
  max_seq_length); a folder without them gets mean pooling and unit length, as sentence-transformers
  gives a bare Hugging Face folder (mean pooling; we also normalise, which is what an embedding
  endpoint is used for, and say so in the model card);
- a cross-encoder reranker (`BertForSequenceClassification`): (query, document) pairs through the model
  and its classifier; with one label, the score is the sigmoid of its logit, as sentence-transformers'
  CrossEncoder and TEI's /rerank report it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

EMBED, RERANK = "embed", "rerank"
EMBED_ARCHITECTURES = ("BertModel",)
RERANK_ARCHITECTURES = ("BertForSequenceClassification",)
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len", "lasttoken")  # sentence-transformers' concat order
_POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
                 "pooling_mode_lasttoken": "lasttoken"}
_MODULES = {"sentence_transformers.models.Transformer": "transformer",
            "sentence_transformers.models.Pooling": "pooling",
            "sentence_transformers.models.Normalize": "normalize"}


class EncoderCheckpointError(ValueError):
    """The folder is not an encoder checkpoint this engine can run; the message says why."""


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str
    num_labels: int  # the classifier's outputs (cross-encoders); 0 for an embedding model


@dataclass(frozen=True)
class EncoderSpec:
    """Everything the engine needs to know about a checkpoint besides its weights."""
    folder: str
    kind: str  # embed | rerank
    architecture: str
    bert: BertConfig
    pooling: tuple[str, ...]  # embed: pooling modes, concatenated in this order
    normalize: bool  # embed: unit-length vectors
    max_seq_len: int  # tokens per input, special tokens included
    dimensions: int  # embed: length of a vector; rerank: the classifier's labels
    torch_dtype: str | None
    sigmoid: bool  # rerank: the score is sigmoid(logit) (one label)
    lowercase: bool = False  # sentence_bert_config.json's do_lower_case: texts lowercased before tokenizing


def is_encoder_checkpoint(folder: str | Path) -> bool:
    """True where config.json names an architecture this package serves (the CLI dispatches on it)."""
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    archs = cfg.get("architectures") or []
    return any(a in EMBED_ARCHITECTURES + RERANK_ARCHITECTURES for a in archs) or (
        not archs and cfg.get("model_type") == "bert")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise EncoderCheckpointError(f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise EncoderCheckpointError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict | list):
        raise EncoderCheckpointError(f"{path}: expected a JSON object")
    return data


def _bert_config(cfg: dict, path: Path, num_labels: int) -> BertConfig:
    need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    missing = [k for k in need if k not in cfg]
    if missing:
        raise EncoderCheckpointError(f"{path} lacks {', '.join(missing)}")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise EncoderCheckpointError(f"{path}: position_embedding_type {cfg['position_embedding_type']!r} "
                                     "is not supported (absolute only)")
    act = cfg.get("hidden_act", "gelu")
    if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
        raise EncoderCheckpointError(f"{path}: hidden_act {act!r} is not supported")
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise EncoderCheckpointError(f"{path}: hidden_size is not a multiple of num_attention_heads")
    return BertConfig(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"],
        num_heads=cfg["num_attention_heads"], intermediate_size=cfg["intermediate_size"],
        max_position_embeddings=cfg.get("max_position_embeddings", 512), type_vocab_size=cfg.get("type_vocab_size", 2),
        layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)), hidden_act=act, num_labels=num_labels)


def _sentence_transformers_modules(folder: Path) -> tuple[tuple[str, ...], bool, int | None, bool]:
    """(pooling modes, normalize, max_seq_length, do_lower_case) from the sentence-transformers files."""
    pooling: tuple[str, ...] = ("mean",)
    normalize = True
    max_len, lowercase = None, False
    st_config = folder / "sentence_bert_config.json"
    if st_config.is_file():
        st = _read_json(st_config)
        max_len, lowercase = st.get("max_seq_length"), bool(st.get("do_lower_case", False))
    modules_path = folder / "modules.json"
    if not modules_path.is_file():
        return pooling, normalize, max_len, lowercase
    modules = _read_json(modules_path)
    if not isinstance(modules, list):
        raise EncoderCheckpointError(f"{modules_path}: expected a list of modules")
    normalize = False
    for m in modules:
        kind = _MODULES.get(m.get("type", ""))
        if kind is None:
            raise EncoderCheckpointError(f"{modules_path}: module {m.get('type')!r} is not supported "
                                         "(Transformer, Pooling and Normalize are)")
        if kind == "pooling":
            pcfg = _read_json(folder / m.get("path", "") / "config.json")
            if pcfg.get("pooling_mode_weightedmean_tokens"):
                raise EncoderCheckpointError(f"{folder}: weighted-mean pooling is not supported")
            if pcfg.get("include_prompt") is False:
                raise EncoderCheckpointError(f"{folder}: pooling without the prompt (include_prompt) is not supported")
            modes = tuple(mode for mode in POOLING_MODES
                          for key, name in _POOLING_KEYS.items() if name == mode and pcfg.get(key))
            if not modes:
                raise EncoderCheckpointError(f"{folder}: the Pooling module sets no pooling mode")
            pooling = modes
        elif kind == "normalize":
            normalize = True
    return pooling, normalize, max_len, lowercase


def load_encoder_spec(folder: str | Path) -> EncoderSpec:
    folder = Path(folder)
    if not folder.is_dir():
        raise EncoderCheckpointError(f"model folder {str(folder)!r} does not exist")
    path = folder / "config.json"
    if not path.is_file():
        raise EncoderCheckpointError(f"{folder} has no config.json: not a Hugging Face checkpoint folder")
    cfg = _read_json(path)
    archs = cfg.get("architectures") or (["BertModel"] if cfg.get("model_type") == "bert" else [])
    arch = next((a for a in archs if a in EMBED_ARCHITECTURES + RERANK_ARCHITECTURES), None)
    if arch is None:
        raise EncoderCheckpointError(f"unsupported encoder architecture {archs!r} in {path}; supported: "
                                     f"{', '.join(EMBED_ARCHITECTURES + RERANK_ARCHITECTURES)}")
    if not (folder / "tokenizer.json").is_file():
        raise EncoderCheckpointError(f"{folder} has no tokenizer.json (a fast tokenizer file is needed)")
    if arch in RERANK_ARCHITECTURES:
        num_labels = cfg.get("num_labels") or len(cfg.get("id2label") or {}) or 2
        if num_labels != 1:
            raise EncoderCheckpointError(f"{path}: a reranker needs exactly one label (its relevance logit); "
                                         f"this classifier has {num_labels}")
        bert = _bert_config(cfg, path, num_labels)
        limit = bert.max_position_embeddings
        st = cfg.get("sentence_transformers") or {}
        activation = st.get("activation_fn")
        sigmoid = num_labels == 1 if activation is None else activation.endswith("Sigmoid")
        return EncoderSpec(str(folder), RERANK, arch, bert, (), False, limit, num_labels,
                           cfg.get("torch_dtype") or cfg.get("dtype"), sigmoid)
    bert = _bert_config(cfg, path, 0)
    pooling, normalize, max_len, lowercase = _sentence_transformers_modules(folder)
    limit = min(int(max_len), bert.max_position_embeddings) if max_len else bert.max_position_embeddings
    return EncoderSpec(str(folder), EMBED, arch, bert, pooling, normalize, limit, bert.hidden_size * len(pooling),
                       cfg.get("torch_dtype") or cfg.get("dtype"), False, lowercase)
