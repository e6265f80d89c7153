"""Logits processors for the sampler: logit_bias, min_tokens, penalties, top-k, top-p and min-p.

Each works on a float32 `[rows, vocab]` tensor holding only the rows that use the feature, with one
parameter per row, so a batch pays for a feature only when some row asks for it.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np
import torch

from argosy.engine.sequence import Sequence


def apply_logit_bias(logits: torch.Tensor, seqs: Seq[Sequence]) -> None:
    """In place: each row's logit_bias added to its tokens' logits (ids checked against the vocab on admission).
    The biases are tensors made once per request, so a bias on every token costs one indexed add a step."""
    biased = [(i, *seq.params.logit_bias_tensors) for i, seq in enumerate(seqs) if seq.params.logit_bias]
    if not biased:
        return
    device = logits.device
    rows = torch.cat([torch.full((len(ids),), i, dtype=torch.long) for i, ids, _ in biased]).to(device)
    cols = torch.cat([ids for _, ids, _ in biased]).to(device)
    values = torch.cat([v for _, _, v in biased]).to(device, logits.dtype)
    logits.index_put_((rows, cols), values, accumulate=True)


def apply_min_tokens(logits: torch.Tensor, seqs: Seq[Sequence], eos_token_ids: set[int]) -> None:
    """In place: while a row has fewer than min_tokens outputs, its EOS and stop token ids get -inf.

    EOS is masked even with ignore_eos, as vLLM does (its min_tokens set always holds the EOS ids).
    """
    vocab_size = logits.shape[-1]
    rows: list[int] = []
    cols: list[int] = []
    for i, seq in enumerate(seqs):
        if seq.num_output_tokens < seq.params.min_tokens:
            banned = [t for t in eos_token_ids.union(seq.params.stop_token_ids) if 0 <= t < vocab_size]
            rows += [i] * len(banned)
            cols += banned
    if rows:
        device = logits.device
        logits[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = float("-inf")


def _padded_ids(id_lists: Seq[list[int]], vocab_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids padded to one width, and a mask of the real entries.

    The padding repeats the row's first id: a gather/scatter_ pair then writes that token's new value twice,
    which is harmless, so no extra vocab column is needed. An empty row is padded with id 0; callers make
    its update a no-op. Ids outside the vocab (only a raw prompt can hold them) are left out: on a GPU an
    out-of-range gather is a device-side assert, not an exception.
    """
    width = max(1, max((len(ids) for ids in id_lists), default=0))
    padded = np.zeros((len(id_lists), width), dtype=np.int64)
    real = np.zeros((len(id_lists), width), dtype=np.bool_)

    def fill(i: int, ids: list[int]) -> None:
        padded[i], real[i] = ids[0] if ids else 0, False
        padded[i, : len(ids)] = ids
        real[i, : len(ids)] = True

    for i, ids in enumerate(id_lists):
        fill(i, ids)
    bad = (padded < 0) | (padded >= vocab_size)
    for i in np.flatnonzero(bad.any(axis=1)):  # rare: refill those rows with their in-vocab ids only
        fill(i, [t for t in id_lists[i] if 0 <= t < vocab_size])
    return torch.from_numpy(padded).to(device), torch.from_numpy(real).to(device)


def _row_param(values: list[float], real: torch.Tensor, neutral: float) -> torch.Tensor:
    """`[rows, 1]` float32 parameter, neutral where a row has no token to penalize (its padding is a stand-in)."""
    t = torch.tensor(values, dtype=torch.float32, device=real.device).unsqueeze(1)
    return torch.where(real.any(dim=1, keepdim=True), t, neutral)


def apply_penalties(logits: torch.Tensor, seqs: Seq[Sequence]) -> torch.Tensor:
    """In place: repetition (prompt + output tokens), then frequency and presence (output tokens), in vLLM's order.

    repetition: a seen token's logit is divided by the penalty when positive, multiplied when negative.
    frequency/presence (OpenAI): logit -= frequency * count + presence * (count > 0).
    Works on the seen token ids only (gather/scatter over [rows, tokens]), never on [rows, vocab] tensors.
    """
    device = logits.device
    params = [s.params for s in seqs]
    rep = [p.repetition_penalty for p in params]
    if any(r != 1.0 for r in rep):
        ids, real = _padded_ids([s.token_ids for s in seqs], logits.shape[-1], device)
        # Any penalty > 0 is accepted (as vLLM's); in float32 1e-300 is 0 and 1e300 inf, and a seen logit / 0
        # is inf, whose softmax is NaN. Kept where a logit of ~100 stays finite either way.
        r = _row_param(rep, real, 1.0).clamp(1e-30, 1e30)
        seen = logits.gather(1, ids)
        logits.scatter_(1, ids, torch.where(seen > 0, seen / r, seen * r))
    freq = [p.frequency_penalty for p in params]
    pres = [p.presence_penalty for p in params]
    if not (any(freq) or any(pres)):
        return logits
    ids, real = _padded_ids([s.output_token_ids for s in seqs], logits.shape[-1], device)
    if any(freq):
        # Each occurrence subtracts the penalty once: count * frequency. Padding adds 0.
        f = torch.tensor(freq, dtype=torch.float32, device=device).unsqueeze(1)
        logits.scatter_add_(1, ids, -f * real)
    if any(pres):
        # Repeats of a token gather and write the same value, so each distinct token is hit once.
        pr = _row_param(pres, real, 0.0)
        logits.scatter_(1, ids, logits.gather(1, ids) - pr)
    return logits


def apply_top_k(logits: torch.Tensor, k: list[int]) -> torch.Tensor:
    """Keep each row's k largest logits (ties with the k-th kept, as vLLM); k in 1..vocab."""
    k_t = torch.tensor(k, dtype=torch.long, device=logits.device).unsqueeze(1)
    # topk with the batch's largest k is cheaper than a full sort when k << vocab.
    kth = logits.topk(max(k), dim=-1).values.gather(1, k_t - 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, p: list[float], start_k: int = 256) -> torch.Tensor:
    """Keep the smallest most-likely set whose probability reaches p: a token stays while the mass
    strictly above it (in sorted order) is below p, so the most likely token always stays.

    A full sort of [rows, vocab] is slow on CPUs (~20x a top-256), and nuclei are usually small: sort the
    top start_k tokens, then widen (x16, up to the full vocab) only for the rows whose window falls short of p.
    """
    num_rows, vocab_size = logits.shape
    probs = logits.softmax(dim=-1)
    p_t = torch.tensor(p, dtype=torch.float32, device=logits.device).unsqueeze(1)
    drop = torch.ones(0)  # set by the first pass, which covers every row
    rows = torch.arange(num_rows, device=logits.device)
    k = min(start_k, vocab_size)
    while rows.numel():
        whole = rows.numel() == num_rows
        top, order = (probs if whole else probs[rows]).topk(k, dim=-1)  # sorted, most likely first
        cum = top.cumsum(dim=-1)
        row_p = p_t if whole else p_t[rows]
        done = torch.ones_like(rows, dtype=torch.bool) if k == vocab_size else cum[:, -1] >= row_p[:, 0]
        keep = (cum - top) < row_p  # an unfinished row is rewritten by a wider pass
        keep[:, 0] = True  # the most likely token, whatever p: a p under float32's smallest (1e-300) is 0 there
        row_drop = torch.ones(len(rows), vocab_size, dtype=torch.bool, device=logits.device).scatter_(1, order, ~keep)
        if whole:
            drop = row_drop
        else:
            drop[rows] = row_drop
        rows = rows[~done]
        k = min(16 * k, vocab_size)
    return logits.masked_fill(drop, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: list[float]) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the row's top probability.

    Done in logit space (p_i < min_p * p_max <=> logit_i < logit_max + log(min_p)): no softmax, and the
    ratio does not change when earlier filters renormalize the distribution.
    """
    log_min_p = torch.tensor(min_p, dtype=torch.float32, device=logits.device).log().unsqueeze(1)
    threshold = logits.amax(dim=-1, keepdim=True) + log_min_p
    return logits.masked_fill(logits < threshold, float("-inf"))
