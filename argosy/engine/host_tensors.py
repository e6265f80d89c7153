"""Step inputs built on the host and sent to the device without waiting for it.

On CUDA a tensor made from a Python list on the device is a synchronous copy from pageable memory: the
host stops until the GPU has finished everything queued before it. Built in pinned (page-locked) memory
and copied with non_blocking=True, the copy is queued behind the running step instead, and the host goes
on preparing (PyTorch's pinned-memory cache keeps the host buffer until the copy has run).
"""

from __future__ import annotations

import torch


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host if device.type == "cpu" else host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def rows_to_device(rows: list[list[int]], width: int, device: torch.device) -> torch.Tensor:
    """Integer rows, each padded with 0 to width, as one int64 [len(rows), width] tensor on device."""
    return to_device([r + [0] * (width - len(r)) for r in rows], torch.long, device)
