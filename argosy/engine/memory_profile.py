"""The KV cache on CUDA, sized from a profiling step (as vLLM does): once the weights are loaded, the
engine runs the largest step it will ever run (the whole token budget, spread over max_num_seqs
sequences, every one sampled with the sampler's costliest settings) and, when CUDA graphs are on, the
largest captured decode step, and measures what each needed at its peak. The KV cache gets what is left
of gpu_memory_utilization x the GPU's memory after what is already in use (the weights, the CUDA
context, other processes), those peaks and what the steps took outside PyTorch's allocator (cuBLAS
workspaces, Triton's kernels). So the largest step can never run out of memory once the cache is full.

The arithmetic is plain integers over a `DeviceMemory` (torch.cuda's memory functions on a GPU, a fake
with recorded values in tests/test_memory_profile.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

GIB = 1 << 30


class DeviceMemory(Protocol):
    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the device, as the driver counts them (every process)."""
        ...

    def memory_allocated(self) -> int: ...

    def max_memory_allocated(self) -> int: ...

    def memory_reserved(self) -> int: ...

    def reset_peak_memory_stats(self) -> None: ...

    def synchronize(self) -> None: ...

    def empty_cache(self) -> None: ...


class CudaMemory:
    """torch.cuda's memory functions for one device."""

    def __init__(self, device: torch.device):
        self.device = device

    def mem_get_info(self) -> tuple[int, int]:
        return torch.cuda.mem_get_info(self.device)

    def memory_allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def max_memory_allocated(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def memory_reserved(self) -> int:
        return torch.cuda.memory_reserved(self.device)

    def reset_peak_memory_stats(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()


# A profiling step: runs once, returns the bytes of its own scaffolding counted in its peak that the engine
# will not need later (the small KV cache it attends over).
ProfileStep = Callable[[], int]


@dataclass(frozen=True)
class MemoryProfile:
    total: int  # the device's memory
    in_use: int  # in use before the steps (every process): weights, the CUDA context, others
    step_peaks: tuple[int, ...]  # each step's peak of PyTorch allocations above what was allocated before
    outside_allocator: int  # what the steps took outside PyTorch's allocator (workspaces, kernel modules)

    def kv_cache_bytes(self, utilization: float) -> int:
        """What gpu_memory_utilization leaves for the KV cache; a ValueError naming the numbers when nothing."""
        limit = utilization * self.total
        budget = int(limit - self.in_use - sum(self.step_peaks) - self.outside_allocator)
        if budget <= 0:
            raise ValueError(
                f"no memory is left for the KV cache: gpu_memory_utilization {utilization:g} allows "
                f"{limit / GIB:.2f} GiB of the GPU's {self.total / GIB:.2f} GiB; {self.in_use / GIB:.2f} GiB are in "
                f"use (weights, CUDA context, other processes) and the largest steps need "
                f"{(sum(self.step_peaks) + self.outside_allocator) / GIB:.2f} GiB more. Raise "
                f"--gpu-memory-utilization, lower --max-num-batched-tokens or --max-num-seqs, or set "
                f"--kv-cache-memory")
        return budget


def profile_steps(memory: DeviceMemory, steps: Sequence[ProfileStep]) -> MemoryProfile:
    """Runs each step once and measures it (each with the allocator's cache emptied first, so a peak is
    that step's own)."""
    memory.synchronize()
    memory.empty_cache()
    free, total = memory.mem_get_info()
    in_use = total - free
    reserved_before = memory.memory_reserved()
    peaks = []
    for step in steps:
        allocated = memory.memory_allocated()
        memory.reset_peak_memory_stats()
        scaffolding = step()
        memory.synchronize()
        peaks.append(max(0, memory.max_memory_allocated() - allocated - scaffolding))
    free_after, _ = memory.mem_get_info()
    # Growth of the device's use that PyTorch's cache does not hold: cuBLAS workspaces, loaded kernels.
    outside = max(0, (total - free_after) - in_use - (memory.memory_reserved() - reserved_before))
    memory.empty_cache()
    return MemoryProfile(total, in_use, tuple(peaks), outside)
