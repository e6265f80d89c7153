"""Tokenizer: a local Hugging Face checkpoint's tokenizer and chat template, without transformers.

tokenizer.json goes through `tokenizers`; its post-processor alone decides BOS/EOS, as in transformers 5
(add_bos_token in tokenizer_config.json is ignored there). tokenizer.model goes through `sentencepiece`
and adds BOS like Llama's tokenizer when add_bos_token (default True).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from argosy.engine.chat_template import load_chat_template, render_chat_template

_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
GIL_FREE_CHARS = 4096  # texts at least this long are tokenized without holding the GIL (~5 ms of work)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _content(token: Any) -> str | None:
    # tokenizer_config.json writes a special token as a string or as an AddedToken dict.
    return token.get("content") if isinstance(token, dict) else token


def _id_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]


class _TokenizersBackend:
    def __init__(self, file: Path, added: dict[int, dict], specials: list[str]):
        self.tok = HFTokenizer.from_file(str(file))
        # Tokens that tokenizer_config.json declares but tokenizer.json lacks are added, as transformers does.
        for _, t in sorted(added.items()):
            if self.tok.token_to_id(t["content"]) is None:
                self.tok.add_tokens([AddedToken(t["content"], special=t.get("special", True),
                                                single_word=t.get("single_word", False), lstrip=t.get("lstrip", False),
                                                rstrip=t.get("rstrip", False), normalized=t.get("normalized", False))])
        missing = [s for s in specials if self.tok.token_to_id(s) is None]
        if missing:
            self.tok.add_special_tokens(missing)
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.special_ids = {i for i, t in self.tok.get_added_tokens_decoder().items() if t.special}

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if len(text) < GIL_FREE_CHARS:
            return self.tok.encode(text, add_special_tokens=add_special_tokens).ids
        # `encode` holds the GIL throughout, `encode_batch` releases it: a long text tokenized in a worker
        # thread then leaves the event loop and the engine thread running (1.5M words held both for 5 s).
        return self.tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    @functools.cached_property
    def longest_token_chars(self) -> int:
        # Byte-level vocabularies spell each byte as one character, so this bounds the text a token covers.
        return max(map(len, self.tok.get_vocab(with_added_tokens=True)), default=1)

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.tok.id_to_token(token_id)


class _SentencePieceBackend:
    def __init__(self, file: Path, specials: list[str], add_bos: bool, add_eos: bool, legacy: bool):
        try:
            import sentencepiece
        except ImportError as e:
            raise ImportError(f"{file} is a sentencepiece model: pip install sentencepiece") from e
        self.sp = sentencepiece.SentencePieceProcessor(model_file=str(file))
        self.add_bos, self.add_eos, self.legacy = add_bos, add_eos, legacy
        self.vocab_size = self.sp.get_piece_size()
        self._unk = self.sp.id_to_piece(self.sp.unk_id())
        self.special_ids = {i for i in range(self.vocab_size) if self.sp.IsControl(i) or self.sp.IsUnknown(i)}
        self.special_ids |= {i for s in specials if (i := self.token_to_id(s)) is not None}
        # sentencepiece spells special tokens out letter by letter; match them in the text first.
        names = sorted({self.sp.id_to_piece(i) for i in self.special_ids}, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, names)) + ")" if names else "(?!)")
        self._unk_len = len(self.sp.encode(self._unk))
        self.bos_id, self.eos_id = self.sp.bos_id(), self.sp.eos_id()

    def _encode_chunk(self, text: str, first: bool) -> list[int]:
        # As transformers' Metaspace does, the dummy "▁" is not prepended to text that starts with a space.
        if self.legacy or (first and not text.startswith(" ")):
            return self.sp.encode(text)
        # Only the text's first chunk gets sentencepiece's dummy "▁" prefix (Metaspace prepend_scheme="first"):
        # encode behind the unk piece and drop it, the trick Llama's slow tokenizer uses.
        return self.sp.encode(self._unk + text)[self._unk_len:]

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids, offset = [], 0
        for i, part in enumerate(self._split.split(text)):
            if i % 2:
                ids.append(self.sp.piece_to_id(part))
            elif part:
                ids += self._encode_chunk(part, first=offset == 0)
            offset += len(part)
        if add_special_tokens and self.add_bos and self.bos_id >= 0:
            ids.insert(0, self.bos_id)
        if add_special_tokens and self.add_eos and self.eos_id >= 0:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        ids = [i for i in ids if 0 <= i < self.vocab_size]  # as in `tokenizers`, ids past the vocab decode to ""
        if skip_special_tokens:
            return self.sp.decode([i for i in ids if i not in self.special_ids])
        out, run = [], []
        for i in [*ids, None]:
            if i is not None and i not in self.special_ids:
                run.append(i)
                continue
            if run:
                text = self.sp.decode(run)
                # sentencepiece drops the first piece's "▁" as the dummy prefix; only the text's start has one.
                if out and self.sp.id_to_piece(run[0]).startswith("▁"):
                    text = " " + text
                out.append(text)
                run = []
            if i is not None:
                out.append(self.sp.id_to_piece(i))
        return "".join(out)

    def token_to_id(self, token: str) -> int | None:
        token_id = self.sp.piece_to_id(token)
        return token_id if token_id != self.sp.unk_id() or token == self._unk else None

    def id_to_token(self, token_id: int) -> str | None:
        return self.sp.id_to_piece(token_id) if 0 <= token_id < self.vocab_size else None

    @functools.cached_property
    def longest_token_chars(self) -> int:
        return max((len(self.sp.id_to_piece(i)) for i in range(self.vocab_size)), default=1)


class Tokenizer:
    """Encode, decode and render chat prompts for one checkpoint (see `from_pretrained`)."""

    def __init__(self, backend: _TokenizersBackend | _SentencePieceBackend, special_tokens: dict[str, str],
                 chat_template: str | None, eos_token_ids: list[int], bos_token_id: int | None):
        self._backend = backend
        self.special_tokens_map = special_tokens  # bos_token, eos_token, ... as the template sees them
        self.chat_template = chat_template
        self.bos_token = special_tokens.get("bos_token")
        self.eos_token = special_tokens.get("eos_token")
        self.bos_token_id = bos_token_id
        self.eos_token_id: int | None = eos_token_ids[0] if eos_token_ids else None  # the primary one
        self.eos_token_ids: set[int] = set(eos_token_ids)
        named = {i for t in special_tokens.values() if (i := backend.token_to_id(t)) is not None}
        self.all_special_ids: set[int] = backend.special_ids | named
        self.vocab_size: int = backend.vocab_size  # added tokens included

    @classmethod
    def from_pretrained(cls, path: str | Path) -> Tokenizer:
        folder = Path(path)
        config = _read_json(folder / "tokenizer_config.json")
        model_config = _read_json(folder / "config.json")
        generation = _read_json(folder / "generation_config.json")
        special = {k: v for k in _SPECIAL_NAMES if (v := _content(config.get(k)))}
        added = {int(k): v for k, v in (config.get("added_tokens_decoder") or {}).items()}
        backend: _TokenizersBackend | _SentencePieceBackend
        if (folder / "tokenizer.json").is_file():
            backend = _TokenizersBackend(folder / "tokenizer.json", added, list(special.values()))
        elif (folder / "tokenizer.model").is_file():
            backend = _SentencePieceBackend(folder / "tokenizer.model", list(special.values()),
                                            add_bos=config.get("add_bos_token", True),
                                            add_eos=config.get("add_eos_token", False),
                                            legacy=config.get("legacy", False))
            for name, token_id in (("bos_token", backend.bos_id), ("eos_token", backend.eos_id)):
                if token_id >= 0:  # the sentencepiece model knows its own BOS/EOS; tokenizer_config.json's win
                    special.setdefault(name, backend.id_to_token(token_id))
        else:
            raise FileNotFoundError(f"No tokenizer in {folder}: looked for tokenizer.json and tokenizer.model.")
        ids = {name: backend.token_to_id(token) for name, token in special.items()}
        if isinstance(backend, _SentencePieceBackend):  # encode adds the BOS/EOS that the config names
            backend.bos_id, backend.eos_id = (-1 if ids.get(n) is None else ids[n] for n in ("bos_token", "eos_token"))
        # EOS: the tokenizer's own, then generation_config.json's (chat models list their end-of-turn token
        # there), then config.json's; a sequence stops on any of them.
        eos_ids = [i for i in [ids.get("eos_token"), *_id_list(generation.get("eos_token_id")),
                               *_id_list(model_config.get("eos_token_id"))] if i is not None]
        bos_id = ids.get("bos_token")
        if bos_id is None:
            bos_id = (_id_list(model_config.get("bos_token_id")) or [None])[0]
        return cls(backend, special, load_chat_template(folder, config), list(dict.fromkeys(eos_ids)), bos_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; add_special_tokens adds BOS/EOS as the checkpoint's tokenizer does.
        A prompt rendered by apply_chat_template already holds them: encode it with add_special_tokens=False."""
        return self._backend.encode(text, add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens)

    def max_chars(self, tokens: int) -> int:
        """More characters than this cannot be `tokens` tokens or fewer, in any text: no token covers more
        than the vocabulary's longest (twice that, for normalizers that merge characters). A server refuses
        a longer prompt for its context without spending the CPU to tokenize it."""
        return 2 * tokens * self._backend.longest_token_chars

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        return [self._backend.id_to_token(i) for i in ids]

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    def apply_chat_template(self, messages: list[Mapping[str, Any]], add_generation_prompt: bool = True,
                            continue_final_message: bool = False, **kwargs: Any) -> str:
        """Render `messages` like transformers' apply_chat_template(tokenize=False). kwargs reach the template
        (tools, documents, enable_thinking, ...); `chat_template=` overrides the checkpoint's template.
        continue_final_message: end inside the last message (an assistant turn the model is to go on with).
        Raises ValueError when there is no template or the template rejects the conversation."""
        template = kwargs.pop("chat_template", None) or self.chat_template
        if template is None:
            raise ValueError("This model has no chat template; use the completions API, or pass a chat template.")
        context = {**self.special_tokens_map, "tools": None, "documents": None, **kwargs}
        return render_chat_template(template, messages, add_generation_prompt, context, continue_final_message)
