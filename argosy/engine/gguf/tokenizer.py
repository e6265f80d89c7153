"""The tokenizer of a GGUF file, rebuilt from its `tokenizer.ggml.*` metadata as a `tokenizers` tokenizer.

- `gpt2` vocabularies (byte-level BPE with merges: SmolLM2, Llama 3, Qwen2/3): the pre-tokenizer is
  chosen by `tokenizer.ggml.pre`, as llama.cpp chooses its split regex.
- `llama` vocabularies (SentencePiece BPE with scores: Llama 2, Mistral): a BPE with byte fallback
  whose merges are ranked by the merged piece's score, as transformers converts such a vocabulary.
Control tokens (type 3) become special added tokens, user-defined ones (type 4) plain added tokens.
BOS/EOS, the chat template and the end-of-generation tokens come from the same metadata.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from argosy.engine.checkpoint import CheckpointError
from argosy.engine.gguf.file import field, open_gguf
from argosy.engine.tokenizer import Tokenizer, _TokenizersBackend

logger = logging.getLogger(__name__)

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> (split each digit first, the split regex; None: GPT-2's, inside ByteLevel)
_PRE = {"default": (False, None), "gpt-2": (False, None), "gpt2": (False, None), "smollm": (True, None),
        "starcoder": (True, None), "refact": (True, None), "llama-bpe": (False, _LLAMA3), "llama3": (False, _LLAMA3),
        "qwen2": (False, _QWEN2), "deepseek-r1-qwen": (False, _QWEN2)}
# Texts llama.cpp also ends generation on when they are control tokens of the vocabulary.
_END_OF_GENERATION = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "<|eom_id|>")


def _byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre not in _PRE:
        logger.warning("GGUF tokenizer pre-type %r is not known here; splitting words as GPT-2 does", pre)
    digits, pattern = _PRE.get(pre, (False, None))
    steps: list[pre_tokenizers.PreTokenizer] = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    if pattern is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    return pre_tokenizers.Sequence(steps)


def _sentencepiece_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """Merges of a SentencePiece BPE vocabulary: every split of a piece into two pieces of the vocabulary,
    ranked by the merged piece's score (higher first), ties by the parts' ids."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, score, kind in zip(tokens, scores, types, strict=True):
        if kind != NORMAL:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def _build(reader: Any, path: str | os.PathLike) -> HFTokenizer:
    kind = field(reader, "tokenizer.ggml.model")
    tokens = field(reader, "tokenizer.ggml.tokens")
    if kind is None or tokens is None:
        raise CheckpointError(f"{path}: GGUF metadata has no tokenizer (tokenizer.ggml.model, tokenizer.ggml.tokens)")
    types = field(reader, "tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    if kind == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges", [])]
        tok = HFTokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
        tok.pre_tokenizer = _byte_level_pre_tokenizer(str(field(reader, "tokenizer.ggml.pre", "default")))
        tok.decoder = decoders.ByteLevel()
    elif kind == "llama":
        scores = field(reader, "tokenizer.ggml.scores")
        if scores is None:
            raise CheckpointError(f"{path}: a SentencePiece (llama) vocabulary without tokenizer.ggml.scores")
        unk_id = field(reader, "tokenizer.ggml.unknown_token_id", 0)
        tok = HFTokenizer(models.BPE(vocab, _sentencepiece_merges(tokens, scores, types), unk_token=tokens[unk_id],
                                     fuse_unk=True, byte_fallback=True))
        steps = [normalizers.Replace(" ", "▁")]
        if field(reader, "tokenizer.ggml.add_space_prefix", True):
            steps.insert(0, normalizers.Prepend("▁"))
        tok.normalizer = normalizers.Sequence(steps)
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         *([decoders.Strip(" ", 1, 0)] if len(steps) == 2 else [])])
    else:
        raise CheckpointError(f"{path}: unsupported GGUF tokenizer model {kind!r} (supported: gpt2, llama)")
    added = [AddedToken(t, special=k == CONTROL, normalized=False) for t, k in zip(tokens, types, strict=True)
             if k in (CONTROL, USER_DEFINED)]
    tok.add_tokens([a for a in added if not a.special])
    tok.add_special_tokens([a for a in added if a.special])
    single, special = "$A", []
    for name, place in (("bos", "{} $A"), ("eos", "$A {}")):
        token_id = field(reader, f"tokenizer.ggml.{name}_token_id")
        default = name == "bos" and kind == "llama"  # llama.cpp's default: SentencePiece vocabularies add BOS
        if token_id is not None and field(reader, f"tokenizer.ggml.add_{name}_token", default):
            single = place.format(tokens[token_id]).replace("$A", single)
            special.append((tokens[token_id], int(token_id)))
    if special:
        tok.post_processor = processors.TemplateProcessing(single=single, pair=f"{single} $B:1", special_tokens=special)
    return tok


class _GGUFBackend(_TokenizersBackend):
    def __init__(self, tok: HFTokenizer):  # the parent's reads tokenizer.json; this one is built in memory
        self.tok = tok
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.special_ids = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}


def gguf_tokenizer(path: str | os.PathLike, reader: Any = None) -> Tokenizer:
    reader = reader if reader is not None else open_gguf(path)
    try:
        backend = _GGUFBackend(_build(reader, path))
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - `tokenizers` raises plain Exception for a vocabulary it cannot take
        raise CheckpointError(f"{path}: the tokenizer in its metadata cannot be built ({type(e).__name__}: {e})") \
            from None
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    special: dict[str, str] = {}
    for name in ("bos", "eos", "unknown", "padding"):
        token_id = field(reader, f"tokenizer.ggml.{name}_token_id")
        if token_id is not None and 0 <= token_id < len(tokens):
            special[{"unknown": "unk_token", "padding": "pad_token"}.get(name, f"{name}_token")] = tokens[token_id]
    eos_ids = [field(reader, f"tokenizer.ggml.{n}_token_id") for n in ("eos", "eot", "eom")]
    eos_ids += [i for i, (t, k) in enumerate(zip(tokens, types, strict=True))
                if k == CONTROL and t in _END_OF_GENERATION]
    bos = field(reader, "tokenizer.ggml.bos_token_id")
    template = field(reader, "tokenizer.chat_template")
    return Tokenizer(backend, special, template, list(dict.fromkeys(int(i) for i in eos_ids if i is not None)),
                     None if bos is None else int(bos))
