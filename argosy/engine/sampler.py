"""The sampler: turns one step's logits into one token per sequence, with vLLM's sampling semantics.

Order per row: logit_bias, min_tokens mask, penalties, the grammar's mask (structured outputs), then greedy
argmax (temperature < 1e-5) or temperature, top-k, top-p, min-p and a draw. Logprobs come from the raw model
logits (vLLM's default `raw_logprobs`). Rows with a grammar have their bitmask filled and applied for the
whole batch at once, and their matchers advanced by the sampled tokens before the call returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from argosy.engine.logits_processors import (
    apply_logit_bias,
    apply_min_p,
    apply_min_tokens,
    apply_penalties,
    apply_top_k,
    apply_top_p,
)
from argosy.engine.outputs import Logprob
from argosy.engine.sequence import Sequence


def ranked_logprobs(logprobs: torch.Tensor, token_ids: list[int], top_ks: list[int]) -> list[dict[int, Logprob]]:
    """Row i's token_ids[i] with its logprob and rank (1 = most likely; ties count as above, as vLLM), then the
    row's top_ks[i] most likely tokens; a token among them keeps its top-k rank (vLLM). `logprobs` are already
    log-softmaxed, [rows, vocab]."""
    chosen_lp = logprobs.gather(1, torch.tensor(token_ids, device=logprobs.device).unsqueeze(1))
    ranks = (logprobs >= chosen_lp).sum(dim=-1).tolist()
    max_k = max(top_ks, default=0)
    top_lps: list[list[float]] = [[] for _ in token_ids]
    top_ids: list[list[int]] = [[] for _ in token_ids]
    if max_k > 0:
        values, indices = logprobs.topk(max_k, dim=-1)
        top_lps, top_ids = values.tolist(), indices.tolist()
    out = []
    for i, (token, lp) in enumerate(zip(token_ids, chosen_lp.squeeze(1).tolist(), strict=True)):
        entry = {token: Logprob(lp, ranks[i])}
        k = top_ks[i]
        entry.update({t: Logprob(v, r + 1) for r, (t, v) in enumerate(zip(top_ids[i][:k], top_lps[i][:k],
                                                                           strict=True))})
        out.append(entry)
    return out


def prompt_logprobs(logits: torch.Tensor, next_token_ids: list[int], top_ks: list[int],
                    rows_at_once: int = 256) -> list[dict[int, Logprob]]:
    """ranked_logprobs of the prompt tokens that row i's raw logits predict. A prefill chunk has up to a step's
    token budget of rows: they are taken rows_at_once at a time, so the float32 copies stay small beside them."""
    out: list[dict[int, Logprob]] = []
    for at in range(0, len(next_token_ids), rows_at_once):
        logprobs = logits[at:at + rows_at_once].float().log_softmax(dim=-1)
        out += ranked_logprobs(logprobs, next_token_ids[at:at + rows_at_once], top_ks[at:at + rows_at_once])
    return out


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[dict[int, Logprob] | None]  # per row: None unless seq.params.logprobs is not None
    sampled_logprobs: list[float | None]  # raw logprob of the sampled token; None when logprobs not asked


def _has_penalty(seq: Sequence) -> bool:
    p = seq.params
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _on_rows(logits: torch.Tensor, rows: list[int], fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Apply fn to the given rows only (all rows: no gather/scatter)."""
    if not rows:
        return logits
    if len(rows) == logits.shape[0]:
        return fn(logits)
    index = torch.tensor(rows, device=logits.device)
    logits[index] = fn(logits[index])
    return logits


class Sampler:
    def __init__(self, vocab_size: int, eos_token_ids: set[int], seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = set(eos_token_ids)
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}  # unseeded rows' noise, one per device
        self._bitmask = None  # a structured.GrammarBitmask, made on the first constrained row

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        n = len(seqs)
        assert logits.dim() == 2 and logits.shape[0] == n, f"logits {tuple(logits.shape)} for {n} sequences"
        assert logits.shape[1] >= self.vocab_size, "logits narrower than the vocabulary"
        raw = logits[:, : self.vocab_size]  # padded vocab columns are never sampled nor reported
        lp_rows = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        min_tok_rows = [i for i, s in enumerate(seqs) if s.num_output_tokens < s.params.min_tokens]
        pen_rows = [i for i, s in enumerate(seqs) if _has_penalty(s)]
        random_rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
        grammar_rows = [i for i, s in enumerate(seqs) if s.grammar is not None and s.grammar.matcher is not None]
        bias_rows = [i for i, s in enumerate(seqs) if s.params.logit_bias]

        if not (lp_rows or min_tok_rows or pen_rows or random_rows or grammar_rows or bias_rows):
            # Fast path: all greedy, nothing to adjust. Upcasting does not change the argmax.
            return SamplerOutput(raw.argmax(dim=-1).tolist(), [None] * n, [None] * n)

        raw_logprobs = None
        if lp_rows:
            raw_logprobs = self._select(raw, lp_rows).float().log_softmax(dim=-1)

        x = raw.to(torch.float32, copy=True)  # processors write in place: never into the caller's tensor
        if bias_rows:
            apply_logit_bias(x, seqs)
        if min_tok_rows:
            apply_min_tokens(x, seqs, self.eos_token_ids)
        x = _on_rows(x, pen_rows, lambda t: apply_penalties(t, [seqs[i] for i in pen_rows]))
        if grammar_rows:
            self._apply_grammars(x, raw, grammar_rows, seqs, min_tok_rows)

        if not random_rows:
            token_ids = x.argmax(dim=-1)
        elif len(random_rows) == n:
            token_ids = self._sample(x, seqs)
        else:
            token_ids = x.argmax(dim=-1)  # one pass over all rows is cheaper than gathering the greedy ones
            index = torch.tensor(random_rows, device=x.device)
            token_ids[index] = self._sample(x[index], [seqs[i] for i in random_rows])

        ids = token_ids.tolist()
        if grammar_rows:
            self._bitmask.accept([seqs[i].grammar for i in grammar_rows], [ids[i] for i in grammar_rows])
        logprobs: list[dict[int, Logprob] | None] = [None] * n
        sampled: list[float | None] = [None] * n
        if raw_logprobs is not None:
            self._fill_logprobs(raw_logprobs, token_ids, lp_rows, seqs, logprobs, sampled)
        return SamplerOutput(ids, logprobs, sampled)

    def _apply_grammars(self, x: torch.Tensor, raw: torch.Tensor, rows: list[int], seqs: list[Sequence],
                        min_tok_rows: list[int]) -> None:
        """In place: each constrained row keeps only the tokens its grammar allows next."""
        if self._bitmask is None:
            from argosy.engine.structured.matcher import GrammarBitmask

            self._bitmask = GrammarBitmask(self.vocab_size)
        matchers = [seqs[i].grammar.matcher for i in rows]
        penalty = self._bitmask.penalty(matchers, x.device)
        if len(rows) == x.shape[0]:
            x.add_(penalty)
        else:
            x.index_add_(0, torch.tensor(rows, device=x.device), penalty)
        # min_tokens may have banned the only token the grammar allows (its stop token, once the document is
        # complete): the grammar wins there, as a row with nothing left to sample cannot go on.
        banned = set(min_tok_rows)
        clash = [j for j, i in enumerate(rows) if i in banned]
        if clash:
            index = torch.tensor([rows[j] for j in clash], device=x.device)
            dead = torch.isinf(x[index]).all(dim=-1)
            if bool(dead.any()):
                fixed = raw[index].float() + penalty[torch.tensor(clash, device=x.device)]
                x[index] = torch.where(dead.unsqueeze(1), fixed, x[index])

    @staticmethod
    def _select(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
        return t if len(rows) == t.shape[0] else t[torch.tensor(rows, device=t.device)]

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Random rows: temperature, top-k, top-p, min-p, then an exponential race. Modifies logits."""
        params = [s.params for s in seqs]
        vocab_size, device = logits.shape[-1], logits.device
        temps = [p.temperature for p in params]
        if any(t != 1.0 for t in temps):
            logits.div_(torch.tensor(temps, dtype=torch.float32, device=device).unsqueeze(1))

        k_rows = [i for i, p in enumerate(params) if 0 < p.top_k < vocab_size]
        logits = _on_rows(logits, k_rows, lambda t: apply_top_k(t, [params[i].top_k for i in k_rows]))
        p_rows = [i for i, p in enumerate(params) if p.top_p < 1.0]
        logits = _on_rows(logits, p_rows, lambda t: apply_top_p(t, [params[i].top_p for i in p_rows]))
        m_rows = [i for i, p in enumerate(params) if p.min_p > 0.0]
        logits = _on_rows(logits, m_rows, lambda t: apply_min_p(t, [params[i].min_p for i in m_rows]))

        probs = logits.softmax(dim=-1)
        # Exponential race: argmax(p_i / E_i) with E_i ~ Exp(1) picks i with probability p_i. E = -log(U):
        # uniform_ + log_ is several times faster than exponential_ on CPUs. A seeded row's noise comes from
        # its own generator only, so its draw does not depend on the rest of the batch.
        noise = torch.empty_like(probs)
        unseeded = [i for i, s in enumerate(seqs) if s.generator is None]
        if len(unseeded) == len(seqs):
            noise.uniform_(generator=self._generator(device))
        else:
            for i, s in enumerate(seqs):
                if s.generator is not None:
                    g = s.generator  # may live on another device than the logits (e.g. a CPU generator)
                    noise[i] = torch.empty(vocab_size, device=g.device).uniform_(generator=g).to(device)
            if unseeded:
                draw = torch.empty(len(unseeded), vocab_size, device=device).uniform_(generator=self._generator(device))
                noise[torch.tensor(unseeded, device=device)] = draw
        # log(U) = -E <= 0, so argmax(p / E) = argmin(p / log U); this saves a negation pass. U = 0 gives
        # p / -inf = -0.0, and a masked token gives 0 / log U = -0.0 (never nan): neither wins over p > 0.
        return (probs / noise.log_()).argmin(dim=-1)

    def _generator(self, device: torch.device) -> torch.Generator:
        g = self._generators.get(device)
        if g is None:
            g = self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return g

    @staticmethod
    def _fill_logprobs(raw_logprobs: torch.Tensor, token_ids: torch.Tensor, rows: list[int], seqs: list[Sequence],
                       out: list[dict[int, Logprob] | None], sampled_out: list[float | None]) -> None:
        """The sampled token's logprob and rank, plus the top-k (ranked_logprobs)."""
        chosen = Sampler._select(token_ids, rows).tolist()
        entries = ranked_logprobs(raw_logprobs, chosen, [seqs[i].params.logprobs or 0 for i in rows])
        for i, token, entry in zip(rows, chosen, entries, strict=True):
            out[i] = entry
            sampled_out[i] = entry[token].logprob
