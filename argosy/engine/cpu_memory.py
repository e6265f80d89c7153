"""CPU memory settings of the engine process (Linux): glibc's allocator, huge pages for the weights, and a KV
cache whose pages are taken as they are first written."""

from __future__ import annotations

import ctypes
import logging
import math
import mmap
import sys

import torch

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14


def keep_freed_memory() -> None:
    """glibc: serve large tensors from the heap and keep freed memory there for the next step.

    By default glibc maps each allocation above a few MB afresh and unmaps it when freed, so every
    step's large temporaries (gathered K/V, activations) fault in zeroed pages again: keeping them took
    40% off the time of bench/engine_throughput.py's 256 requests (2026-12-03). tcmalloc and jemalloc,
    which vLLM's CPU backend preloads, keep freed memory the same way. The process then holds its peak
    memory, as a serving engine does anyway.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return
    m_trim_threshold, m_mmap_max = -1, -4
    mallopt(m_mmap_max, 0)
    mallopt(m_trim_threshold, 2**31 - 1)


def zeroed_on_first_touch(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of zeros in an anonymous mapping of its own: the kernel gives each page, zeroed, when it is
    first written.

    For the KV cache. torch.zeros writes every page at start: for the CPU's default 2 GiB cache, 0.7 s of a
    1.9 s replica start. Here that work is done as each block is first used, while the replica already
    serves (the free queue hands out every block before it reuses one, so a busy replica holds its whole
    budget after one pass). The heap would not do: keep_freed_memory() serves even large tensors from it,
    and reused heap memory is not zero. vLLM's CPU backend does not write its cache at start either.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)  # the tensor keeps the mapping


def weights_in_huge_pages(model: torch.nn.Module) -> bool:
    """Gives the model's parameters fresh memory, one buffer per dtype, advised to transparent huge
    pages (2 MiB), before the checkpoint is copied in; False (nothing moved) where the kernel does not
    offer them, or not on Linux. The parameters' values are not kept: call it before loading weights.

    A step that decodes one sequence streams every weight once. With 4 KiB pages the CPU's prefetchers
    stop at each page boundary; with 2 MiB pages that step took 16.3 against 17.8 ms a token
    (bench/single_stream.py's 125M model, best of 10 runs each, alternated in one process, 2026-12-03).
    The old storage is left untouched, so the process does not hold the weights twice.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                return False
        madvise = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return False
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for p in model.parameters():  # a tied weight is listed once
        if p.device.type == "cpu":
            by_dtype.setdefault(p.dtype, []).append(p)
    for dtype, params in by_dtype.items():
        elem = params[0].element_size()
        size = sum(p.numel() for p in params)
        # Advised before its first touch, so that the checkpoint's copy faults in huge pages.
        arena = torch.empty(size + 2 * HUGE_PAGE // elem, dtype=dtype)
        start = -arena.data_ptr() % HUGE_PAGE // elem
        span = (size * elem + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
        if madvise(arena.data_ptr() + start * elem, span, MADV_HUGEPAGE) != 0:
            return False
        offset = start
        for p in params:
            p.data = arena[offset:offset + p.numel()].view(p.shape)  # the views keep the arena alive
            offset += p.numel()
    return True
