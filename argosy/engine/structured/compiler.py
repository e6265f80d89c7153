"""Compiles requests' grammars against the model's vocabulary, off the engine's step.

The vocabulary is read once, on the first structured request (a large one takes seconds), in the
compiler's own thread; each grammar is compiled there too, once per spec (an LRU of futures). The
grammar engine releases the GIL while it compiles, so the engine thread keeps stepping the other
requests meanwhile: a sequence whose grammar is not ready is skipped by the scheduler.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from argosy.engine.structured.params import StructuredOutputsParams, _clean

logger = logging.getLogger(__name__)

CACHE_SIZE = 512  # compiled grammars kept (a small schema's is tens of KiB)


def tokenizer_info(tokenizer: Any, vocab_size: int, stop_token_ids: set[int]) -> Any:
    """The grammar engine's view of the vocabulary: each token's text as the tokenizer stores it, and how
    that encodes bytes (byte-level, byte-fallback or raw). Special tokens get no text, so a grammar never
    admits them as characters (an EOS spelled `</s>` inside a JSON string would end the sequence)."""
    import xgrammar as xgr

    backend = tokenizer._backend
    encoded = [""] * vocab_size
    if hasattr(backend, "tok"):  # tokenizers' tokenizer.json
        for token, i in backend.tok.get_vocab(with_added_tokens=True).items():
            if i < vocab_size:
                encoded[i] = token
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(backend.tok.to_str())
        vocab_type, add_prefix_space = meta["vocab_type"], meta["add_prefix_space"]
    elif hasattr(backend, "sp"):  # sentencepiece: "▁" for spaces, <0xNN> byte pieces
        for i in range(min(backend.vocab_size, vocab_size)):
            encoded[i] = backend.sp.id_to_piece(i)
        vocab_type, add_prefix_space = xgr.VocabType.BYTE_FALLBACK, True
    else:  # any other backend: each token's decoded text
        for i in range(min(tokenizer.vocab_size, vocab_size)):
            encoded[i] = tokenizer.decode([i], skip_special_tokens=False)
        vocab_type, add_prefix_space = xgr.VocabType.RAW, False
    for i in tokenizer.all_special_ids | set(stop_token_ids):
        if 0 <= i < vocab_size:
            encoded[i] = ""
    return xgr.TokenizerInfo(encoded, vocab_type, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids),
                             add_prefix_space=add_prefix_space)


class GrammarCompiler:
    """Per engine: compile(params) -> a Future of the compiled grammar (shared by equal specs)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: set[int]):
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._stop_token_ids = set(stop_token_ids)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="argosy-grammar")
        self._compiler: Any = None  # built in the pool's thread on first use
        self._cache: OrderedDict[tuple, Future] = OrderedDict()

    def compile(self, params: StructuredOutputsParams) -> Future:
        key = params.key()
        future = self._cache.get(key)
        if future is not None and not (future.done() and (future.cancelled() or future.exception() is not None)):
            self._cache.move_to_end(key)
            return future
        grammar = params.to_grammar()  # raises StructuredOutputsError here, on the caller's thread (cached)
        future = self._pool.submit(self._compile, grammar)
        self._cache[key] = future
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return future

    def drop(self, future: Future) -> None:
        """No request waits for `future` any more: if it has not started compiling, it never will (a client
        that left had kept its compile queued for the requests behind it), and its spec compiles anew."""
        if future.cancel():
            for key in [k for k, f in self._cache.items() if f is future]:
                del self._cache[key]

    def _compile(self, grammar: Any) -> Any:
        import xgrammar as xgr

        if self._compiler is None:
            info = tokenizer_info(self._tokenizer, self.vocab_size, self._stop_token_ids)
            # The engine keeps its own cache (above); the compiler's threads stay few on a shared CPU.
            self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        try:
            return self._compiler.compile_grammar(grammar)
        except Exception as exc:
            raise ValueError(_clean(str(exc))) from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
