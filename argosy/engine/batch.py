"""One engine step's inputs: the scheduled sequences flattened into one batch of tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from argosy.engine.attention import AttentionBackend, AttentionMetadata, PrefillChunk
from argosy.engine.host_tensors import to_device
from argosy.engine.sequence import Sequence


@dataclass
class BatchInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_indices: torch.Tensor  # rows whose logits are wanted: one per sampling sequence, then prompt rows
    sampling_seqs: list[Sequence]
    # Prompt logprobs: (sequence, first position, count) for the rows after the sampling ones, in order; the
    # logits at position p give the logprob of prompt token p + 1.
    prompt_logprob_spans: list[tuple[Sequence, int, int]] = field(default_factory=list)


def prepare_batch(scheduled: list[tuple[Sequence, int]], block_size: int, device: torch.device,
                  attention: AttentionBackend) -> BatchInputs:
    """scheduled: (sequence, tokens to compute this step). Decodes (one token) come first, sorted by
    context length so that the groups attention batches waste little padding; the attention backend
    decides the groups."""
    bs = block_size
    decodes = sorted(((s, n) for s, n in scheduled if n == 1), key=lambda x: x[0].num_computed_tokens)
    prefills = [(s, n) for s, n in scheduled if n > 1]
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    sample_rows: list[int] = []
    sampling_seqs: list[Sequence] = []
    decode_lens: list[int] = []
    decode_tables: list[list[int]] = []
    prompt_rows: list[int] = []
    spans: list[tuple[Sequence, int, int]] = []

    def want_prompt_logprobs(seq: Sequence, start: int, end: int, q_start: int) -> None:
        """Rows for positions start..end-1 that predict a prompt token not yet given its logprob."""
        first, last = max(start, len(seq.prompt_logprobs) - 1), min(end, seq.num_prompt_tokens - 1)
        if last > first:
            prompt_rows.extend(range(q_start + first - start, q_start + last - start))
            spans.append((seq, first, last - first))

    for seq, _ in decodes:
        pos = seq.num_computed_tokens
        input_ids.append(seq.token_ids[pos])
        positions.append(pos)
        slots.append(seq.block_ids[pos // bs] * bs + pos % bs)
        decode_lens.append(pos + 1)
        decode_tables.append(seq.block_ids[: (pos + bs) // bs])
        if seq.wants_prompt_logprobs:  # a one-token prompt chunk
            want_prompt_logprobs(seq, pos, pos + 1, len(input_ids) - 1)
        if pos + 1 == seq.num_tokens:
            sample_rows.append(len(input_ids) - 1)
            sampling_seqs.append(seq)
    chunks: list[PrefillChunk] = []
    chunk_tables: list[list[int]] = []
    for seq, n in prefills:
        start = seq.num_computed_tokens
        end = start + n
        q_start = len(input_ids)
        input_ids.extend(seq.token_ids[start:end])
        positions.extend(range(start, end))
        ids = seq.block_ids
        slots.extend(ids[p // bs] * bs + p % bs for p in range(start, end))
        table = mask = None
        chunk_tables.append(ids[: (end + bs - 1) // bs])
        if start:  # earlier tokens are in the cache: read them through the block table
            table = to_device(chunk_tables[-1], torch.long, device)
            # Query i sits at position start + i and sees keys up to that position.
            mask = torch.ones(n, end, dtype=torch.bool, device=device).tril(start)
        chunks.append(PrefillChunk(q_start, n, end, table, mask))
        if seq.wants_prompt_logprobs:
            want_prompt_logprobs(seq, start, end, q_start)
        if end == seq.num_tokens:
            sample_rows.append(len(input_ids) - 1)
            sampling_seqs.append(seq)
    # One host-to-device copy for the four per-token arrays (on CUDA: queued, no sync; host_tensors.py).
    t = len(input_ids)
    flat = to_device(input_ids + positions + slots + sample_rows + prompt_rows, torch.long, device)
    meta = AttentionMetadata(
        slot_mapping=flat[2 * t:3 * t],
        decode_groups=attention.decode_groups(decode_tables, decode_lens),
        prefills=chunks,
    )
    meta.packed_prefills = attention.pack_prefills(chunks, chunk_tables) if chunks else None
    return BatchInputs(
        input_ids=flat[:t],
        positions=flat[t:2 * t],
        meta=meta,
        sample_indices=flat[3 * t:],
        sampling_seqs=sampling_seqs,
        prompt_logprob_spans=spans,
    )
