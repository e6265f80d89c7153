"""The checkpoint's fast tokenizer (tokenizer.json): texts and (query, document) pairs to token ids.

Inputs are encoded whole first; one longer than the limit is an error unless the request asked for
truncation, and then only that input is encoded again with the tokenizer's own truncation (special
tokens kept, as transformers truncates). Encoding releases the GIL (the Rust library), so the server
runs it in a thread beside the model.
"""

from __future__ import annotations

import threading
from pathlib import Path

from tokenizers import Tokenizer

from argosy.encoder.errors import EncoderInputError, InputTooLongError


class EncoderTokenizer:
    def __init__(self, folder: str | Path, lowercase: bool = False):
        self.source = (Path(folder) / "tokenizer.json").read_text(encoding="utf-8")
        self.lowercase = lowercase
        self.base = self._fresh()
        self._truncating: dict[tuple[int, str], Tokenizer] = {}
        self._lock = threading.Lock()
        self.vocab_size = self.base.get_vocab_size(with_added_tokens=True)
        self.pad_id = self.base.token_to_id("[PAD]") or 0

    def _fresh(self) -> Tokenizer:
        tok = Tokenizer.from_str(self.source)
        tok.no_padding()
        tok.no_truncation()
        return tok

    def _truncator(self, max_len: int, direction: str) -> Tokenizer:
        key = (max_len, direction)
        with self._lock:
            tok = self._truncating.get(key)
            if tok is None:
                if len(self._truncating) >= 8:  # requests may name any length: keep a few
                    self._truncating.pop(next(iter(self._truncating)))
                tok = self._fresh()
                tok.enable_truncation(max_len, strategy="longest_first", direction=direction)
                self._truncating[key] = tok
        return tok

    def _prepare(self, texts: list[str]) -> list[str]:
        return [t.lower() for t in texts] if self.lowercase else texts

    def encode_texts(self, texts: list[str], max_len: int, truncate: bool, direction: str = "right",
                     param: str = "input") -> list[list[int]]:
        texts = self._prepare(texts)
        for i, t in enumerate(texts):
            if not t:
                raise EncoderInputError(f"{param}[{i}] is empty", param)
        encs = self.base.encode_batch(texts)
        out = [e.ids for e in encs]
        for i, ids in enumerate(out):
            if len(ids) > max_len:
                if not truncate:
                    raise InputTooLongError(i, len(ids), max_len, param)
                out[i] = self._truncator(max_len, direction).encode(texts[i]).ids
        return out

    def encode_pairs(self, query: str, documents: list[str], max_len: int, truncate: bool,
                     param: str = "documents") -> list[tuple[list[int], list[int]]]:
        if not query:
            raise EncoderInputError("query is empty", "query")
        for i, d in enumerate(documents):
            if not d:
                raise EncoderInputError(f"{param}[{i}] is empty", param)
        query, *documents = self._prepare([query, *documents])
        encs = self.base.encode_batch([(query, d) for d in documents])
        out = [(e.ids, e.type_ids) for e in encs]
        for i, (ids, _) in enumerate(out):
            if len(ids) > max_len:
                if not truncate:
                    raise InputTooLongError(i, len(ids), max_len, param)
                e = self._truncator(max_len, "right").encode(query, documents[i])
                out[i] = (e.ids, e.type_ids)
        return out

    def check_ids(self, inputs: list[list[int]], max_len: int, truncate: bool, direction: str = "right",
                  param: str = "input") -> list[list[int]]:
        """Token ids given by the caller, used as they are (special tokens included), checked and cut."""
        out = []
        for i, ids in enumerate(inputs):
            if not ids:
                raise EncoderInputError(f"{param}[{i}] has no tokens", param)
            bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise EncoderInputError(f"{param}[{i}]: token id {bad} is outside the vocabulary "
                                      f"(0..{self.vocab_size - 1})", param)
            if len(ids) > max_len:
                if not truncate:
                    raise InputTooLongError(i, len(ids), max_len, param)
                ids = ids[:max_len] if direction == "right" else ids[-max_len:]
            out.append(list(ids))
        return out

    def decode(self, ids: list[int]) -> str:
        return self.base.decode(ids)
