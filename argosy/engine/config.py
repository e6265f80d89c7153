"""The engine's settings: one frozen dataclass, filled from `LLM(...)` keywords or CLI flags."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineConfig:
    model: str
    dtype: str = "auto"  # auto follows the checkpoint, except float32 on the CPU
    device: str = "auto"  # auto: cuda where present, else cpu
    block_size: int = 16
    kv_cache_memory_gib: float | None = None  # None: a fraction of free device memory (CPU: 2 GiB)
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: 2048 on CUDA; on the CPU 512, or 2048 offline
    max_model_len: int | None = None  # None: the checkpoint's max_position_embeddings
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"  # fcfs | priority
    seed: int = 0
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # How the other ranks start: mp (spawned here), ray (actors in a placement group), torchrun (the
    # processes torchrun started). None: torchrun when run under it, else mp. See docs/parallel.md.
    distributed_executor_backend: str | None = None
    max_logprobs: int = 20
    # offline (the LLM class: throughput first) or server (a replica: latency between tokens first).
    usage: str = "server"
    # CPU: one-token steps through a torch.compile'd matrix-vector product (argosy/engine/matvec.py);
    # about 2x on a single stream, at the price of a compile when the engine starts.
    compile_matvec: bool = False

    def __post_init__(self) -> None:
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be fcfs or priority, got {self.scheduling_policy!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}")
        if self.tensor_parallel_size < 1 or self.pipeline_parallel_size < 1:
            raise ValueError("tensor_parallel_size and pipeline_parallel_size must be at least 1")
        if self.usage not in ("offline", "server"):
            raise ValueError(f"usage must be offline or server, got {self.usage!r}")
        if self.distributed_executor_backend not in (None, "mp", "ray", "torchrun"):
            raise ValueError("distributed_executor_backend must be mp, ray or torchrun, "
                             f"got {self.distributed_executor_backend!r}")

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def token_budget(self, device: torch.device) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if device.type == "cuda":
            return 2048
        # A server's decodes wait for the prefill chunk that shares their step, so it takes small chunks.
        # Offline, bigger steps win: fewer of them, with more decodes each (2048 gave 1.2x the output
        # tok/s of 512 and of 4096 in bench/engine_throughput.py; vLLM's CPU default there is 4096).
        return 2048 if self.usage == "offline" else 512
