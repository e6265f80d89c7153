"""What a profile says one replica can do: decode and prefill tokens/s, and the largest batch that fits, by
sequence length (`argosy profile` prints it; the same step times drive `argosy sim`)."""

from __future__ import annotations

import math

from argosy.sim.profile import StepProfile

SEQ_LENS = (1024, 2048, 4096, 8192, 32768, 131072)
PREFILL_CHUNK = 8192  # tokens per prefill step (vLLM's default chunk on a GPU is of this order)


def capacity_table(prof: StepProfile, max_num_seqs: int = 256, max_len: int | None = None) -> list[dict]:
    """Per sequence length (prompt + output tokens held in the KV cache): the most sequences whose KV fits,
    decode tokens/s for one sequence and at the batch that fits (capped by max_num_seqs)."""
    rows = []
    seqs = [seq for seq in SEQ_LENS if max_len is None or seq <= max_len]
    if max_len is not None and max_len not in seqs and max_len < SEQ_LENS[-1]:
        seqs.append(max_len)  # the model's own context is the last row
    for seq in seqs:
        fits = prof.num_blocks // math.ceil(seq / prof.block_size)
        batch = min(fits, max_num_seqs)
        row = {"seq_len": seq, "max_batch_fits": fits, "batch": batch,
               "decode_tok_s_1": 1 / prof.step_s(0, 1, seq),
               "decode_tok_s": batch / prof.step_s(0, batch, batch * seq) if batch else 0.0}
        rows.append(row)
    return rows


def prefill_tok_s(prof: StepProfile, chunk: int = PREFILL_CHUNK) -> float:
    return chunk / prof.step_s(chunk, 0, chunk, chunk * (chunk + 1) // 2)


def render_capacity(prof: StepProfile, max_num_seqs: int = 256, max_len: int | None = None) -> str:
    lines = [f"one replica of {prof.name}: KV cache {prof.num_blocks * prof.block_size:,} tokens; "
             f"prefill {prefill_tok_s(prof):,.0f} tokens/s (chunks of {PREFILL_CHUNK:,})",
             f"  {'sequence':>10} {'fits (seqs)':>12} {'decode, 1 seq':>15} {'decode, batch':>15} {'batch':>6}"]
    for r in capacity_table(prof, max_num_seqs, max_len):
        lines.append(f"  {r['seq_len']:>7,} tok {r['max_batch_fits']:>12,} {r['decode_tok_s_1']:>11,.0f} tok/s "
                     f"{r['decode_tok_s']:>11,.0f} tok/s {r['batch']:>6}")
    lines.append(f"  (batch: the most sequences of that length whose KV fits, at most max_num_seqs {max_num_seqs})")
    return "\n".join(lines)
