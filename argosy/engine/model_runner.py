"""Runners: a model, its KV cache tensors and its attention backend; one flattened batch per engine step.

Loading (checkpoint -> model) is loader.py, the device's choices are platforms/, the batch layout is
batch.py and attention is attention/; a runner puts them together. LLMEngine drives a `Runner`:
ModelRunner here (one process), or parallel/executor.py's ParallelExecutor (the driver of T x P ranks,
each a parallel/worker.py Worker, which shares RunnerBase with ModelRunner).
"""

from __future__ import annotations

from collections.abc import Sequence as Steps
from typing import Protocol

import torch

from argosy.engine.attention import (
    AttentionBackend,
    AttentionContext,
    AttentionMetadata,
    create_backend,
    select_backend,
)
from argosy.engine.batch import BatchInputs, prepare_batch
from argosy.engine.checkpoint import ModelConfig
from argosy.engine.config import EngineConfig
from argosy.engine.cuda_graphs import DecodeGraphs, GraphCapture, capture_sizes
from argosy.engine.dummy_steps import largest_decode, largest_step
from argosy.engine.loader import Checkpoint, load_model, open_checkpoint
from argosy.engine.memory_profile import ProfileStep
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

    def kv_cache_blocks(self, profile: Steps[ProfileStep] = ()) -> int:
        """Blocks that the KV cache budget holds: kv_cache_memory_gib, else the platform's default (on
        CUDA: what is left once the profile's steps have run; memory_profile.py)."""
        if self.config.kv_cache_memory_gib is not None:
            budget = self.config.kv_cache_memory_gib * GIB
        else:
            budget = self.platform.kv_cache_budget(self.config, profile)
        num_blocks = int(budget // self.kv_bytes_per_block())
        if num_blocks < 2:
            raise ValueError(
                f"the KV cache budget ({budget / GIB:.3f} GiB) holds fewer than 2 blocks of "
                f"{self.kv_bytes_per_block() / 2**20:.2f} MiB; raise kv_cache_memory_gib"
            )
        return num_blocks

    def allocate_kv_cache(self, num_blocks: int, spare_blocks: int = 0) -> None:
        """num_blocks for the KV cache manager, and spare_blocks after them that it never hands out
        (the padding rows of CUDA graphs write there)."""
        self.num_blocks = num_blocks
        shape = (2, num_blocks + spare_blocks, self.block_size, self.num_kv_heads, self.model_config.head_dim)
        self.kv_caches = [self.platform.kv_cache_tensor(shape, self.dtype, self.device) for _ in self.model.layers]
        self.use_attention()

    def use_attention(self, name: str | None = None) -> AttentionBackend:
        """Puts the named attention backend (default: the engine's attention_backend setting, else the best
        for this device and dtype) in every layer and in the batch layout."""
        name = name or self.config.attention_backend
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
        self.platform.use_threads(config.cpu_threads)
        checkpoint = checkpoint or open_checkpoint(config.model)
        self.model_config = checkpoint.config
        self.dtype = resolve_dtype(config, self.model_config, self.platform)
        self.block_size = config.block_size
        self.num_kv_heads = self.model_config.num_kv_heads
        self.model = load_model(checkpoint, config, self.device, self.dtype, self.platform)
        self.graphs: DecodeGraphs | None = None
        backend = select_backend(self.device, self.dtype, config.attention_backend)
        capture = None if config.enforce_eager or not backend.captures_decodes else self.platform.graph_capture()
        sizes = capture_sizes(config.max_num_seqs) if capture is not None else []
        with torch.inference_mode():  # the profiling steps run the model
            profile = [largest_step(self)] + ([largest_decode(self, sizes[-1])] if sizes else [])
            blocks = self.kv_cache_blocks(profile)
        self.allocate_kv_cache(blocks, spare_blocks=1 if capture is not None else 0)
        if capture is not None:
            self.capture_decode_graphs(capture, sizes)

    def capture_decode_graphs(self, capture: GraphCapture, sizes: list[int]) -> None:
        """One graph per size (cuda_graphs.py); block tables as wide as the model's context."""
        context = self.config.max_model_len or self.model_config.max_position_embeddings
        graphs = DecodeGraphs(sizes, -(-context // self.block_size), self.num_blocks, self.block_size, self.device)
        with torch.inference_mode():
            graphs.capture_all(self.run_model, capture)
        self.graphs = graphs

    def run_model(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """float32 logits of every row (what a captured decode step records)."""
        return self.model.compute_logits(self.model(input_ids, positions, self.kv_caches, meta)).float()

    @torch.inference_mode()
    def execute(self, batch: BatchInputs) -> torch.Tensor:
        """Runs the model; returns float32 logits of the rows in sample_indices, [len(sample_indices), vocab]."""
        if self.graphs is not None and self.graphs.covers(batch):
            return self.graphs.run(batch)
        hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.meta)
        if not len(batch.sample_indices):
            return hidden.new_empty((0, self.model_config.vocab_size), dtype=torch.float32)
        return self.model.compute_logits(hidden[batch.sample_indices]).float()

    def submit(self, batch: BatchInputs) -> torch.Tensor:
        return self.execute(batch)

    def collect(self, handle: torch.Tensor) -> torch.Tensor:
        return handle

    def close(self) -> None:
        pass  # nothing outside this process
