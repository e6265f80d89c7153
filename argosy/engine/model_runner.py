"""Loads the model, owns the KV cache tensors, and runs one flattened batch per engine step."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from argosy.engine import cpu_kernels
from argosy.engine.attention import AttentionMetadata, DecodeGroup, PrefillChunk
from argosy.engine.checkpoint import ModelConfig, iter_weights, load_model_config
from argosy.engine.config import DTYPES, EngineConfig
from argosy.engine.cpu_linear import route_cpu_linears
from argosy.engine.cpu_memory import keep_freed_memory, weights_in_huge_pages
from argosy.engine.matvec import enable_compiled_matvec
from argosy.engine.models.llama import Attention, LlamaForCausalLM, RMSNorm, rope_inv_freq
from argosy.engine.sequence import Sequence

logger = logging.getLogger(__name__)

GIB = 1 << 30
CPU_DEFAULT_KV_GIB = 2.0  # on the CPU: this, or a quarter of the available RAM if less
CPU_DECODE_GROUP_BYTES = 4 << 20  # K and V of one decode group, one layer (measured best of 1-32 MiB)


def resolve_dtype(config: EngineConfig, model_cfg: ModelConfig, device: torch.device) -> torch.dtype:
    if config.dtype != "auto":
        return DTYPES[config.dtype]
    if device.type == "cpu":
        return torch.float32  # half-precision matmuls on most CPUs are slower than float32
    return DTYPES.get(str(model_cfg.torch_dtype), torch.bfloat16)


def store_linears_transposed(model: torch.nn.Module) -> None:
    """Keeps each linear weight as a transposed view of an [in, out] buffer.

    F.linear then hands MKL the [in, out] layout, whose matrix-vector products stream memory about 20%
    faster on the CPU: that is most of a decode step. A weight shared with the embedding (tied) stays,
    since the embedding lookup needs whole rows.
    """
    shared = model.embed_tokens.weight
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight is not shared:
            module.weight = torch.nn.Parameter(module.weight.data.t().contiguous().t(), requires_grad=False)


def use_small_op_kernels(model: torch.nn.Module) -> None:
    """RMS norm and RoPE through the C kernels of cpu_kernels (CPU, float32), where they could be built."""
    if not cpu_kernels.available():
        return
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.kernel = cpu_kernels.rms_norm
        elif isinstance(module, Attention):
            module.rope_kernel = cpu_kernels.rope_


def available_memory() -> float:
    """Bytes of RAM still available (Linux); a large number where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")


@dataclass
class BatchInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_indices: torch.Tensor  # rows of the flattened batch whose logits are sampled
    sampling_seqs: list[Sequence]


class ModelRunner:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = config.resolved_device()
        if self.device.type == "cpu":
            keep_freed_memory()
        self.model_config = load_model_config(config.model)
        self.dtype = resolve_dtype(config, self.model_config, self.device)
        self.block_size = config.block_size
        with torch.device("meta"):
            model = LlamaForCausalLM(self.model_config)
        model = model.to_empty(device=self.device).to(self.dtype)
        if self.device.type == "cpu":
            weights_in_huge_pages(model)
        # to_empty left the rotary frequencies uninitialised; they stay float32 in any model dtype.
        model.inv_freq = rope_inv_freq(self.model_config).to(self.device)
        model.load_weights(iter_weights(config.model, self.device))
        if self.device.type == "cpu":
            routed = route_cpu_linears(model)
            matvec = config.compile_matvec and enable_compiled_matvec(model)  # wraps the one-row case
            if not (routed or matvec):  # both want [out, in] weights; F.linear (MKL) does better with [in, out]
                store_linears_transposed(model)
            if self.dtype == torch.float32:
                use_small_op_kernels(model)
        self.model = model.eval()
        self.num_blocks = self._num_kv_blocks()
        cfg = self.model_config
        shape = (2, self.num_blocks, self.block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(cfg.num_layers)]
        self.decode_group_blocks = self._decode_group_blocks()
        self.decode_kernel = self._decode_kernel()

    def kv_bytes_per_block(self) -> int:
        cfg = self.model_config
        elem = torch.finfo(self.dtype).bits // 8
        return 2 * cfg.num_layers * self.block_size * cfg.num_kv_heads * cfg.head_dim * elem

    def _decode_group_blocks(self) -> int:
        # Attention copies each decode group's blocks out of the cache; on the CPU a group whose copy fits
        # in the cores' caches is read back from there by attention instead of from memory.
        if self.device.type != "cpu":
            return 1 << 30
        return max(1, CPU_DECODE_GROUP_BYTES // (self.kv_bytes_per_block() // len(self.kv_caches)))

    def _decode_kernel(self) -> bool:
        """Whether decodes go to the C kernel (CPU, float32, kernels built): then one group with lengths."""
        return self.device.type == "cpu" and self.dtype == torch.float32 and cpu_kernels.available()

    def _num_kv_blocks(self) -> int:
        if self.config.kv_cache_memory_gib is not None:
            budget = self.config.kv_cache_memory_gib * GIB
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            used = total - free
            budget = self.config.gpu_memory_utilization * total - used
        else:
            budget = min(CPU_DEFAULT_KV_GIB * GIB, 0.25 * available_memory())
        num_blocks = int(budget // self.kv_bytes_per_block())
        if num_blocks < 2:
            raise ValueError(
                f"the KV cache budget ({budget / GIB:.3f} GiB) holds fewer than 2 blocks of "
                f"{self.kv_bytes_per_block() / 2**20:.2f} MiB; raise kv_cache_memory_gib"
            )
        return num_blocks

    def prepare(self, scheduled: list[tuple[Sequence, int]]) -> BatchInputs:
        bs = self.block_size
        # Decodes (one token) first, so attention can batch them in one call.
        # Decodes sorted by context length, so that the groups attention batches waste little padding.
        decodes = sorted(((s, n) for s, n in scheduled if n == 1), key=lambda x: x[0].num_computed_tokens)
        prefills = [(s, n) for s, n in scheduled if n > 1]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        sampling_seqs: list[Sequence] = []
        decode_lens: list[int] = []
        decode_tables: list[list[int]] = []
        for seq, _ in decodes:
            pos = seq.num_computed_tokens
            input_ids.append(seq.token_ids[pos])
            positions.append(pos)
            slots.append(seq.block_ids[pos // bs] * bs + pos % bs)
            decode_lens.append(pos + 1)
            decode_tables.append(seq.block_ids[: (pos + bs) // bs])
            if pos + 1 == seq.num_tokens:
                sample_rows.append(len(input_ids) - 1)
                sampling_seqs.append(seq)
        chunks: list[PrefillChunk] = []
        for seq, n in prefills:
            start = seq.num_computed_tokens
            end = start + n
            q_start = len(input_ids)
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            ids = seq.block_ids
            slots.extend(ids[p // bs] * bs + p % bs for p in range(start, end))
            table = mask = None
            if start:  # earlier tokens are in the cache: read them through the block table
                table = torch.tensor(ids[: (end + bs - 1) // bs], dtype=torch.long, device=self.device)
                # Query i sits at position start + i and sees keys up to that position.
                mask = torch.ones(n, end, dtype=torch.bool, device=self.device).tril(start)
            chunks.append(PrefillChunk(q_start, n, end, table, mask))
            if end == seq.num_tokens:
                sample_rows.append(len(input_ids) - 1)
                sampling_seqs.append(seq)
        dev = self.device
        groups = self._decode_groups(decode_tables, decode_lens)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            decode_groups=groups,
            prefills=chunks,
        )
        return BatchInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.long, device=dev),
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            meta=meta,
            sample_indices=torch.tensor(sample_rows, dtype=torch.long, device=dev),
            sampling_seqs=sampling_seqs,
        )

    def _decode_groups(self, tables: list[list[int]], lens: list[int]) -> list[DecodeGroup]:
        """Splits the (length-sorted) decodes where padding to the group's longest would waste > 25%,
        or where the group would copy more than decode_group_blocks blocks."""
        if self.decode_kernel and tables:  # the kernel reads each decode's own length: one group
            width = max(map(len, tables))
            table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)
            return [DecodeGroup(0, len(tables), table, None, context_lens=torch.tensor(lens, dtype=torch.long))]
        groups, bs, start = [], self.block_size, 0
        while start < len(tables):
            end, used = start + 1, len(tables[start])
            while end < len(tables):
                padded = (end - start + 1) * len(tables[end])
                if padded > 1.25 * (used + len(tables[end])) or padded > self.decode_group_blocks:
                    break
                used += len(tables[end])
                end += 1
            count, width = end - start, len(tables[end - 1])
            table = torch.tensor([t + [0] * (width - len(t)) for t in tables[start:end]], dtype=torch.long)
            mask, context_len = None, lens[start]  # a lone decode: no padding, its K/V cut to its context
            if count > 1:
                mask = torch.arange(width * bs).unsqueeze(0) < torch.tensor(lens[start:end]).unsqueeze(1)
                mask, context_len = mask.view(count, 1, 1, width * bs).to(self.device), 0
            groups.append(DecodeGroup(start, count, table.to(self.device), mask, context_len))
            start = end
        return groups

    @torch.inference_mode()
    def execute(self, batch: BatchInputs) -> torch.Tensor:
        """Runs the model; returns float32 logits for the sampling rows, [len(sampling_seqs), vocab]."""
        hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.meta)
        if not batch.sampling_seqs:
            return hidden.new_empty((0, self.model_config.vocab_size), dtype=torch.float32)
        return self.model.compute_logits(hidden[batch.sample_indices]).float()
