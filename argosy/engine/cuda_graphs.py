"""CUDA graphs for decode steps: at start, one graph per batch-size bucket (1, 2, 4, 8, 16, 24, 32, 48, ...
up to max_num_seqs, at most 256) records a whole decode step (the model and the logits) reading only
persistent input buffers; a decode step then copies its inputs into those buffers (device to device, no
sync), pads to its bucket and replays the graph: one launch instead of one per kernel.

Padding rows write their K/V to a spare block that no sequence owns (the runner allocates one more block
than the KV cache manager sees) and attend to that one slot, so they read and write nothing real.

What a graph may capture is the attention backend's say (`captures_decodes`: one decode group whose
lengths and block tables are tensors; the Triton backend). How a graph is recorded is a `GraphCapture`:
CUDA's on a GPU; tests on the CPU give one that re-runs the step at each replay, which checks this module's
buffers, padding and bucket choice against the plain path.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Protocol

import torch

from argosy.engine.attention import AttentionMetadata, DecodeGroup
from argosy.engine.batch import BatchInputs

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
# The step a graph records: (input_ids, positions, attention metadata) -> float32 logits of every row.
DecodeStep = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


class GraphCapture(Protocol):
    def capture(self, step: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, Callable[[], None]]:
        """Records step (which reads only persistent tensors); returns its output tensor and a replay
        function, after which that same tensor holds the step's result for the buffers' new values."""
        ...


class CudaGraphCapture:
    """torch.cuda.CUDAGraph, all graphs in one memory pool (captured largest first, the smaller ones reuse
    its memory)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, step: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, Callable[[], None]]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = step()
        return out, graph.replay


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes captured: the buckets below max_num_seqs, and max_num_seqs itself (up to 256;
    a larger decode batch runs eagerly)."""
    top = min(max_num_seqs, BUCKETS[-1])
    return [b for b in BUCKETS if b < top] + [top]


def bucket_for(n: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds n decodes; None when none does."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


class DecodeGraphs:
    def __init__(self, sizes: list[int], max_blocks: int, spare_block: int, block_size: int, device: torch.device):
        self.sizes = sorted(sizes)
        self.max_blocks = max_blocks  # block-table width: the longest context a captured step can hold
        self.spare_block = spare_block
        self.spare_slot = spare_block * block_size
        most = self.sizes[-1]
        self.input_ids = torch.zeros(most, dtype=torch.long, device=device)
        self.positions = torch.zeros(most, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((most,), self.spare_slot, dtype=torch.long, device=device)
        self.block_table = torch.full((most, max_blocks), spare_block, dtype=torch.long, device=device)
        self.context_lens = torch.ones(most, dtype=torch.long, device=device)
        self.graphs: dict[int, tuple[torch.Tensor, Callable[[], None]]] = {}
        self.replays = 0

    def capture_all(self, step: DecodeStep, capture: GraphCapture) -> None:
        for size in reversed(self.sizes):  # largest first: the pool it leaves serves the smaller ones
            meta = AttentionMetadata(self.slot_mapping[:size], [DecodeGroup(
                0, size, self.block_table[:size], None, context_lens=self.context_lens[:size])], [])

            def run(size: int = size, meta: AttentionMetadata = meta) -> torch.Tensor:
                return step(self.input_ids[:size], self.positions[:size], meta)

            run()  # once outside the capture: Triton compiles its kernels, cuBLAS picks its algorithms
            self.graphs[size] = capture.capture(run)

    def covers(self, batch: BatchInputs) -> bool:
        """A decode-only step of at most the largest size, in one group of tensor lengths, short enough."""
        meta = batch.meta
        if meta.prefills or len(meta.decode_groups) != 1:
            return False
        group = meta.decode_groups[0]
        return (group.context_lens is not None and group.count <= self.sizes[-1]
                and group.block_table.shape[1] <= self.max_blocks)

    def run(self, batch: BatchInputs) -> torch.Tensor:
        """The step's float32 logits for its sampling rows, from the graph of its bucket."""
        group = batch.meta.decode_groups[0]
        n, width = group.count, group.block_table.shape[1]
        size = bucket_for(n, self.sizes)
        self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.positions[:n].copy_(batch.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(batch.meta.slot_mapping, non_blocking=True)
        self.block_table[:n, :width].copy_(group.block_table, non_blocking=True)
        self.context_lens[:n].copy_(group.context_lens, non_blocking=True)
        if size > n:  # padding rows: the spare slot, one token of context
            self.slot_mapping[n:size].fill_(self.spare_slot)
            self.block_table[n:size, 0].fill_(self.spare_block)
            self.context_lens[n:size].fill_(1)
        logits, replay = self.graphs[size]
        replay()
        self.replays += 1
        return logits[batch.sample_indices]  # a new tensor: the next replay leaves it alone
