"""Shared pieces of the benchmarks: a checkpoint to measure on, seeded workloads, and printing."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import torch

CACHE = Path(os.environ.get("ARGOSY_BENCH_CACHE", Path.home() / ".cache" / "argosy-bench"))


def checkpoint(size: str, vocab_size: int = 8192, arch: str = "llama") -> str:
    """A random-weight checkpoint of the given size preset, built once and reused."""
    from argosy.engine.random_model import make_random_model

    path = CACHE / f"{arch}-{size}-v{vocab_size}"
    if not (path / "model.safetensors").exists():
        print(f"building a random {arch} checkpoint ({size}) in {path} ...", flush=True)
        make_random_model(path, arch=arch, size=size, vocab_size=vocab_size, max_position_embeddings=4096)
    return str(path)


def workload(num: int, prompt_range: tuple[int, int], output_range: tuple[int, int], vocab: int, seed: int = 0):
    """(prompt token ids, output length) pairs, uniform lengths, fixed seed."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        p = int(torch.randint(prompt_range[0], prompt_range[1] + 1, (1,), generator=g))
        o = int(torch.randint(output_range[0], output_range[1] + 1, (1,), generator=g))
        out.append((torch.randint(10, vocab, (p,), generator=g).tolist(), o))
    return out


def param_count(path: str) -> int:
    from safetensors import safe_open

    with safe_open(str(Path(path) / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def progress(msg: str) -> None:
    sys.stderr.write(f"\r{msg}")
    sys.stderr.flush()


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start
