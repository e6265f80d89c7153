"""The encoder engine's settings: one frozen dataclass, filled from `Encoder(...)` keywords or CLI flags."""

from __future__ import annotations

from dataclasses import dataclass

CPU_BATCH_TOKENS = 4096  # a CPU forward pass is compute-bound well before this; more only adds latency
CUDA_BATCH_TOKENS = 16384
MAX_CLIENT_BATCH_SIZE = 2048  # inputs in one request: OpenAI's bound on an embeddings request's list


@dataclass(frozen=True)
class EncoderConfig:
    model: str
    dtype: str = "auto"  # auto: float32 on the CPU, the checkpoint's dtype on CUDA (float32 if it names none)
    device: str = "auto"  # auto: cuda where present, else cpu
    max_num_batched_tokens: int | None = None  # tokens in one forward pass (None: CPU 4096, CUDA 16384)
    max_num_seqs: int = 256  # sequences in one forward pass
    max_model_len: int | None = None  # tokens per input (None: the checkpoint's, e.g. max_seq_length)
    max_client_batch_size: int = MAX_CLIENT_BATCH_SIZE
    cpu_threads: int | None = None  # CPU: the kernels' threads (None: the usable cores; EngineConfig's)

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        for name in ("max_num_seqs", "max_client_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("max_num_batched_tokens", "max_model_len", "cpu_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
