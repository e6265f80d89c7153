"""Runners: a model, its KV cache tensors and its attention backend; one flattened batch per engine step.

Loading (checkpoint -> model) is loader.py, the device's choices are platforms/, the batch layout is
batch.py and attention is attention/; a runner puts them together. LLMEngine drives a `Runner`:
ModelRunner here (one process), or parallel/executor.py's ParallelExecutor (the driver of T x P ranks,
each a parallel/worker.py Worker, which shares RunnerBase with ModelRunner).
"""

from __future__ import annotations

from typing import Protocol

import torch

from argosy.engine.attention import AttentionBackend, AttentionContext, create_backend
from argosy.engine.batch import BatchInputs, prepare_batch
from argosy.engine.checkpoint import ModelConfig
from argosy.engine.config import EngineConfig
from argosy.engine.loader import Checkpoint, load_model, open_checkpoint
from argosy.engine.models.llama import Attention
from argosy.engine.platforms import Platform, platform_for
from argosy.engine.platforms.base import resolve_dtype
from argosy.engine.sequence import Sequence

GIB = 1 << 30


class Runner(Protocol):
    """What LLMEngine needs from a runner."""

    device: torch.device
    model_config: ModelConfig
    num_blocks: int
    pipeline_depth: int  # micro-batches kept in flight (submit, then collect); 1: execute() each step

    def prepare(self, scheduled: list[tuple[Sequence, int]]) -> BatchInputs: ...

    def execute(self, batch: BatchInputs) -> torch.Tensor: ...

    def submit(self, batch: BatchInputs) -> object: ...

    def collect(self, handle: object) -> torch.Tensor: ...

    def close(self) -> None: ...


class RunnerBase:
    """What the runner of a whole model and the runner of one rank's shard share: the KV cache's size
    and tensors, the attention backend every layer uses, and the batch layout."""

    config: EngineConfig
    platform: Platform
    device: torch.device
    dtype: torch.dtype
    block_size: int
    model: torch.nn.Module
    model_config: ModelConfig
    num_kv_heads: int  # this runner's (a tensor-parallel rank holds some of the model's)

    def kv_bytes_per_block(self) -> int:
        """K and V of one block, every layer this runner holds."""
        elem = torch.finfo(self.dtype).bits // 8
        return 2 * len(self.model.layers) * self.block_size * self.num_kv_heads * self.model_config.head_dim * elem

    def kv_cache_blocks(self) -> int:
        """Blocks that the KV cache budget holds: kv_cache_memory_gib, else the platform's default."""
        if self.config.kv_cache_memory_gib is not None:
            budget = self.config.kv_cache_memory_gib * GIB
        else:
            budget = self.platform.kv_cache_budget(self.config)
        num_blocks = int(budget // self.kv_bytes_per_block())
        if num_blocks < 2:
            raise ValueError(
                f"the KV cache budget ({budget / GIB:.3f} GiB) holds fewer than 2 blocks of "
                f"{self.kv_bytes_per_block() / 2**20:.2f} MiB; raise kv_cache_memory_gib"
            )
        return num_blocks

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        shape = (2, num_blocks, self.block_size, self.num_kv_heads, self.model_config.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.model.layers]
        self.use_attention()

    def use_attention(self, name: str | None = None) -> AttentionBackend:
        """Puts the named attention backend (default: the best for this device and dtype) in every layer
        and in the batch layout."""
        ctx = AttentionContext(self.device, self.dtype, self.block_size,
                               self.kv_bytes_per_block() // len(self.kv_caches), self.platform.decode_copy_bytes)
        self.attention = create_backend(ctx, name)
        for module in self.model.modules():
            if isinstance(module, Attention):
                module.backend = self.attention
        return self.attention

    def prepare(self, scheduled: list[tuple[Sequence, int]]) -> BatchInputs:
        return prepare_batch(scheduled, self.block_size, self.device, self.attention)


class ModelRunner(RunnerBase):
    """The whole model in this process."""

    pipeline_depth = 1

    def __init__(self, config: EngineConfig, checkpoint: Checkpoint | None = None):
        self.config = config
        self.device = config.resolved_device()
        self.platform = platform_for(self.device)
        self.platform.prepare_process()
        checkpoint = checkpoint or open_checkpoint(config.model)
        self.model_config = checkpoint.config
        self.dtype = resolve_dtype(config, self.model_config, self.platform)
        self.block_size = config.block_size
        self.num_kv_heads = self.model_config.num_kv_heads
        self.model = load_model(checkpoint, config, self.device, self.dtype, self.platform)
        self.allocate_kv_cache(self.kv_cache_blocks())

    @torch.inference_mode()
    def execute(self, batch: BatchInputs) -> torch.Tensor:
        """Runs the model; returns float32 logits for the sampling rows, [len(sampling_seqs), vocab]."""
        hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.meta)
        if not batch.sampling_seqs:
            return hidden.new_empty((0, self.model_config.vocab_size), dtype=torch.float32)
        return self.model.compute_logits(hidden[batch.sample_indices]).float()

    def submit(self, batch: BatchInputs) -> torch.Tensor:
        return self.execute(batch)

    def collect(self, handle: torch.Tensor) -> torch.Tensor:
        return handle

    def close(self) -> None:
        pass  # nothing outside this process
