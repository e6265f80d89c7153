"""Writes small random-weight BERT checkpoints (tests, `argosy make-test-model --arch bert-embed|bert-rerank`).

An embedding model is a BertModel folder with sentence-transformers' modules (pooling as asked, a
Normalize module); a reranker is a BertForSequenceClassification folder with one label, as cross-encoders
ship. Both carry a WordPiece tokenizer (tokenizer.json and vocab.txt) that transformers loads too.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch
from safetensors.torch import save_file

PRESETS = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
    "small": dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=12),
}
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ("the a an of to in is was for on with as by at from it that this be are or and not but have has "
         "model server token query document search rank score text vector cat dog city river music paris "
         "france capital red blue green fast slow day night light water fire earth learn play run read write "
         "question answer data world time year people house book food").split()


def _vocab() -> list[str]:
    pieces = list(string.ascii_lowercase) + list(string.digits) + list(string.punctuation)
    return SPECIAL + pieces + [f"##{c}" for c in string.ascii_lowercase + string.digits] + WORDS


def write_bert_tokenizer(folder: Path, max_length: int) -> int:
    from tokenizers import BertWordPieceTokenizer

    vocab = _vocab()
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=True)
    tok.save(str(folder / "tokenizer.json"))
    specials = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                "mask_token": "[MASK]"}
    (folder / "special_tokens_map.json").write_text(json.dumps(specials))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": max_length, **specials}))
    return len(vocab)


def make_random_bert(folder: str | Path, kind: str = "embed", size: str = "tiny", pooling: str = "mean",
                     normalize: bool = True, max_position_embeddings: int = 128, max_seq_length: int | None = None,
                     seed: int = 0, init_std: float = 0.2) -> Path:
    """kind: embed (BertModel + sentence-transformers modules) or rerank (BertForSequenceClassification)."""
    if kind not in ("embed", "rerank"):
        raise ValueError(f"kind must be embed or rerank, got {kind!r}")
    if size not in PRESETS:
        raise ValueError(f"unknown size {size!r}; choose from {', '.join(PRESETS)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = write_bert_tokenizer(folder, max_position_embeddings)
    dims = PRESETS[size]
    h, inter, layers = dims["hidden_size"], dims["intermediate_size"], dims["num_hidden_layers"]
    config = {"architectures": ["BertModel" if kind == "embed" else "BertForSequenceClassification"],
              "model_type": "bert", "vocab_size": vocab_size, "max_position_embeddings": max_position_embeddings,
              "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu", "pad_token_id": 0,
              "position_embedding_type": "absolute", "hidden_dropout_prob": 0.1,
              "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02, "torch_dtype": "float32", **dims}
    if kind == "rerank":
        config.update(num_labels=1, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * init_std

    prefix = "bert." if kind == "rerank" else ""
    w = {f"{prefix}embeddings.word_embeddings.weight": rand(vocab_size, h),
         f"{prefix}embeddings.position_embeddings.weight": rand(max_position_embeddings, h),
         f"{prefix}embeddings.token_type_embeddings.weight": rand(2, h),
         f"{prefix}embeddings.LayerNorm.weight": 1 + rand(h), f"{prefix}embeddings.LayerNorm.bias": rand(h)}
    for i in range(layers):
        p = f"{prefix}encoder.layer.{i}."
        for name, (out_dim, in_dim) in {"attention.self.query": (h, h), "attention.self.key": (h, h),
                                        "attention.self.value": (h, h), "attention.output.dense": (h, h),
                                        "intermediate.dense": (inter, h), "output.dense": (h, inter)}.items():
            w[p + name + ".weight"] = rand(out_dim, in_dim) / (in_dim ** 0.5 * init_std) * 0.5
            w[p + name + ".bias"] = rand(out_dim)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + norm + ".weight"], w[p + norm + ".bias"] = 1 + rand(h), rand(h)
    if kind == "rerank":
        w["bert.pooler.dense.weight"], w["bert.pooler.dense.bias"] = rand(h, h) / (h ** 0.5 * init_std), rand(h)
        w["classifier.weight"], w["classifier.bias"] = rand(1, h) / (h ** 0.5 * init_std), rand(1)
    save_file({k: v.contiguous() for k, v in w.items()}, str(folder / "model.safetensors"))
    if kind == "embed":
        _write_sentence_transformers(folder, h, pooling, normalize, max_seq_length)
    return folder


def _write_sentence_transformers(folder: Path, hidden: int, pooling: str, normalize: bool,
                                 max_seq_length: int | None) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules, indent=1))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    modes = {m: False for m in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "lasttoken")}
    for mode in pooling.split("+"):
        key = {"cls": "cls_token", "mean": "mean_tokens", "max": "max_tokens", "mean_sqrt_len": "mean_sqrt_len_tokens",
               "lasttoken": "lasttoken"}[mode]
        modes[key] = True
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden, **{f"pooling_mode_{k}": v for k, v in modes.items()}}))
    if max_seq_length is not None:
        (folder / "sentence_bert_config.json").write_text(json.dumps(
            {"max_seq_length": max_seq_length, "do_lower_case": False}))
