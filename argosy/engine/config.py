"""The engine's settings: one frozen dataclass, filled from `LLM(...)` keywords, CLI flags or a fleet file.

This is the one place where each setting has its default, its help text and its allowed range (see
settings.py): `argosy engine` / `argosy generate` flags and the fleet file's `engine:` section are
generated from these fields. No torch here: the gateway and the fleet controller import it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from argosy.engine.settings import setting, settings_of

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16")
# The C decode kernel keeps one block's scores per query head on its thread's stack (csrc/paged_attention.c),
# and gather + SDPA copies whole blocks: a power of two up to this is what both are tested with.
MAX_BLOCK_SIZE = 256
# OpenMP makes every thread asked for at its first parallel region: 10**6 threads segfaulted torch here.
MAX_CPU_THREADS = 1024
CPU_DEFAULT_KV_GIB = 2.0  # the CPU's KV cache without kv_cache_memory_gib: this, or a quarter of free RAM if less
DEVICE_PATTERN = (r"auto|cpu|cuda(:\d+)?", "auto, cpu, cuda or cuda:N")


@dataclass(frozen=True)
class EngineConfig:
    model: str = setting(help="checkpoint folder", flag=None, fleet=False)  # flags: each command's own default
    dtype: str = setting("auto", "weights and activations: auto follows the checkpoint (float32 on the CPU)",
                         choices=("auto", *DTYPE_NAMES))
    device: str = setting("auto", "auto (cuda where present, else cpu), cpu, cuda or cuda:N", pattern=DEVICE_PATTERN)
    block_size: int = setting(16, "tokens per KV block", power_of_two=True, at_most=MAX_BLOCK_SIZE)
    kv_cache_memory_gib: float | None = setting(
        None, f"KV cache size in GiB, per rank (default: on CUDA what gpu_memory_utilization leaves; on the CPU "
        f"{CPU_DEFAULT_KV_GIB:g} GiB, or a quarter of the available RAM if less)",
        flag="--kv-cache-memory", metavar="GIB", above=0)
    gpu_memory_utilization: float = setting(
        0.9, "CUDA, without --kv-cache-memory: the share of the GPU's memory the engine fills (weights and KV "
        "cache together)", above=0, at_most=1)
    max_num_seqs: int = setting(256, "most sequences in one batch", at_least=1)
    max_num_batched_tokens: int | None = setting(
        None, "token budget of one step (default: 2048 on CUDA; on the CPU 512 for a server, 2048 offline)",
        at_least=1)
    max_model_len: int | None = setting(None, "context length in tokens (default: the model's)", at_least=1)
    enable_prefix_caching: bool = setting(True, "automatic prefix caching (--no-prefix-caching turns it off)",
                                         flag="--no-prefix-caching")
    scheduling_policy: str = setting("fcfs", "fcfs, or priority (a request's priority first, then arrival)",
                                     choices=("fcfs", "priority"))
    seed: int = setting(0, "seed of requests that set none")
    tensor_parallel_size: int = setting(1, "GPUs (or CPU ranks) per pipeline stage", short="-tp", at_least=1)
    pipeline_parallel_size: int = setting(1, "pipeline stages", short="-pp", at_least=1)
    # How the other ranks start: mp (spawned here), ray (actors in a placement group), torchrun (the
    # processes torchrun started). None: torchrun when run under it, else mp. See docs/parallel.md.
    distributed_executor_backend: str | None = setting(
        None, "how the other ranks start: mp (local processes), ray (a placement group on the Ray cluster), "
        "torchrun (default: torchrun when started by it, else mp)", choices=("mp", "ray", "torchrun"))
    # CPU: the kernels' threads in each rank. None: the cores the process may use (its cgroup's quota
    # included), shared among the host's ranks. A fleet sets it for the CPU replicas it starts on one
    # machine, so that they do not oversubscribe its cores (docs/fleet.md).
    cpu_threads: int | None = setting(None, "CPU: threads of each rank's kernels (default: the cores this process "
                                      "may use, its cgroup's CPU quota included, shared among the host's ranks)",
                                      at_least=1, at_most=MAX_CPU_THREADS)
    max_logprobs: int = setting(20, "most logprobs a request may ask for", at_least=0)
    # offline (the LLM class: throughput first) or server (a replica: latency between tokens first).
    usage: str = setting("server", "offline or server", flag=None, fleet=False, choices=("offline", "server"))
    # CPU: one-token steps through a torch.compile'd matrix-vector product (argosy/engine/matvec.py);
    # about 2x on a single stream, at the price of a compile when the engine starts.
    compile_matvec: bool = setting(False, "CPU: one-token steps through a compiled matrix-vector product (~2x "
                                          "single stream; compiles at start)")
    # CPU: a float checkpoint's linear layers quantized at load to GGML blocks (engine/quantize.py); a
    # GGUF file's quantized tensors stay as they are without it.
    quantization: str | None = setting(None, "CPU: quantize a float checkpoint's linear layers at load (q8_0 or "
                                             "q4_0); a GGUF file keeps its own", choices=("q8_0", "q4_0"))
    # CPU, weights kept in their GGUF type (GGML blocks, F16, BF16, F32): a batch's products (3 or more rows:
    # prefill, several decodes) can take bfloat16 operands with float32 sums, about twice as fast where the
    # CPU has AVX512-BF16 (vdpbf16ps); one or two rows always keep float32, and so do F32 weights under
    # auto (a float32 file gives the float32 model's tokens). See docs/gguf.md.
    quant_batch_dtype: str = setting(
        "auto", "CPU, GGUF weights kept in their file type: operands of batched products (3+ rows): bfloat16 "
        "(float32 sums, ~2x), float32, or auto: bfloat16 where the CPU has AVX512-BF16, F32 weights excepted",
        choices=("auto", "bfloat16", "float32"))
    # The attention kernels (engine/attention/): None picks the best registered one for the device and dtype
    # (triton on CUDA where triton is installed, cpu_kernel on the CPU in float32, else sdpa).
    attention_backend: str | None = setting(
        None, "attention kernels: triton, cpu_kernel or sdpa (default: the best for the device and dtype)",
        pattern=(r"[a-z0-9_]+", "a backend's name (triton, cpu_kernel, sdpa)"))
    # CUDA graphs (engine/cuda_graphs.py): decode steps replayed from graphs captured at start, one per
    # batch-size bucket up to max_num_seqs (at most 256); mixed and prefill steps run eagerly.
    enforce_eager: bool = setting(False, "CUDA: no CUDA graphs (decode steps launch their kernels one by one)")

    def __post_init__(self) -> None:
        if isinstance(self.model, os.PathLike):
            object.__setattr__(self, "model", os.fspath(self.model))
        from argosy.engine.model_names import resolve_model

        object.__setattr__(self, "model", resolve_model(self.model))  # `builtin`, `smollm2`: their paths
        for name, declared in settings_of(EngineConfig).items():
            # Stored as checked: an int given for a float becomes the float.
            object.__setattr__(self, name, declared.check(getattr(self, name)))
        if str(self.model).lower().endswith(".gguf") and self.tensor_parallel_size * self.pipeline_parallel_size > 1:
            raise ValueError("a GGUF checkpoint runs on one rank: tensor/pipeline parallelism needs a Hugging Face "
                             "folder")

    def resolved_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def token_budget(self, device: torch.device) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return default_token_budget(device.type, self.usage)


def default_token_budget(device_type: str, usage: str = "server") -> int:
    """max_num_batched_tokens when unset: what `argosy engine` (usage server) or `LLM` (offline) picks."""
    if device_type != "cpu":
        return 2048
    # A server's decodes wait for the prefill chunk that shares their step, so it takes small chunks.
    # Offline, bigger steps win: fewer of them, with more decodes each (2048 gave 1.2x the output
    # tok/s of 512 and of 4096 in bench/engine_throughput.py; vLLM's CPU default there is 4096).
    return 2048 if usage == "offline" else 512
