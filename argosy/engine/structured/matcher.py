"""Per-sequence grammar state, and the batch's token bitmask applied to the logits in one pass."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import torch


class SequenceGrammar:
    """One sequence's grammar: the compiled grammar's future, then the matcher that follows its tokens."""

    __slots__ = ("future", "matcher", "error")

    def __init__(self, future: Future):
        self.future = future
        self.matcher: Any = None
        self.error: str | None = None  # compiling failed, or a token was refused: the engine ends the sequence

    def ready(self) -> bool:
        """Whether the sequence can be scheduled (its matcher exists, or it failed and will be ended)."""
        if self.matcher is not None or self.error is not None:
            return True
        if not self.future.done():
            return False
        exc = self.future.exception()
        if exc is not None:
            self.error = f"the grammar could not be compiled: {exc}"
            return True
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(self.future.result())
        return True

    @property
    def terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted: nothing more may follow."""
        return self.matcher is not None and self.matcher.is_terminated()


def _bit_table(device: torch.device) -> torch.Tensor:
    """[256, 8] float32: 0 where a byte's bit is set (allowed), -inf where not (bit i of byte b: token 8b+i)."""
    bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
    return torch.where(bits.bool(), 0.0, float("-inf")).to(device)


def bitmask_penalty(bitmask: torch.Tensor, table: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [rows, words] bitmask (bit t % 32 of word t // 32 set: token t allowed) -> [rows, vocab] 0/-inf.
    Read as little-endian bytes, byte j holds tokens 8j..8j+7, least significant bit first: one lookup."""
    rows = bitmask.shape[0]
    return table[bitmask.view(torch.uint8).long()].view(rows, -1)[:, :vocab_size]


class GrammarBitmask:
    """Fills the bitmask of a batch's constrained rows (the grammar engine's threads, one call) and turns it
    into an additive 0/-inf penalty with one table lookup, for the sampler to add to those rows."""

    def __init__(self, vocab_size: int, max_threads: int = 2):
        import xgrammar as xgr

        self.vocab_size = vocab_size
        self._words = (vocab_size + 31) // 32
        self._batch = xgr.BatchGrammarMatcher(max_threads)
        self._bitmask = torch.empty(0, self._words, dtype=torch.int32)
        self._tables: dict[torch.device, torch.Tensor] = {}

    def penalty(self, matchers: list[Any], device: torch.device) -> torch.Tensor:
        """[len(matchers), vocab] float32: 0 for the tokens each grammar allows next, -inf elsewhere."""
        k = len(matchers)
        if self._bitmask.shape[0] < k:
            self._bitmask = torch.empty(max(k, 2 * self._bitmask.shape[0]), self._words, dtype=torch.int32)
        bitmask = self._bitmask[:k]
        self._batch.batch_fill_next_token_bitmask(matchers, bitmask)
        table = self._tables.get(device)
        if table is None:
            table = self._tables[device] = _bit_table(device)
        return bitmask_penalty(bitmask.to(device, non_blocking=True), table, self.vocab_size)

    @staticmethod
    def accept(grammars: list[SequenceGrammar], token_ids: list[int]) -> None:
        """Advances each matcher by its sampled token (one call for the batch)."""
        import xgrammar as xgr

        accepted = xgr.BatchGrammarMatcher.batch_accept_token([g.matcher for g in grammars], token_ids)
        for grammar, ok, token in zip(grammars, accepted, token_ids, strict=True):
            if not ok:
                grammar.error = f"the grammar refused token {token}"
