"""Sizing the KV cache on CUDA from a profiling step (engine/memory_profile.py, dummy_steps.py): the
arithmetic over a fake device-memory API with recorded values, the steps the runner profiles (run for real
on the CPU), and CUDA's default dtype. The numbers on a real GPU come from bench/gpu_check.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from argosy.engine import model_runner
from argosy.engine.config import EngineConfig
from argosy.engine.dummy_steps import largest_decode, largest_step, split_tokens
from argosy.engine.loader import open_checkpoint
from argosy.engine.memory_profile import profile_steps
from argosy.engine.model_runner import ModelRunner
from argosy.engine.platforms.cuda import CudaPlatform
from tests.test_cuda_graphs import EagerCapture

GIB = 1 << 30


class FakeMemory:
    """The torch.cuda memory functions over recorded numbers: each step given to `step` moves them as a
    step that allocates `peak` bytes at its height (`kept` of them still cached by the allocator after),
    and `outside` bytes outside the allocator, would."""

    def __init__(self, total: int, in_use: int, allocated: int):
        self.total, self.used, self.allocated, self.peak, self.reserved = total, in_use, allocated, allocated, allocated
        self.calls: list[str] = []

    def step(self, peak: int, kept: int = 0, outside: int = 0, scaffolding: int = 0):
        def run() -> int:
            self.calls.append("step")
            self.peak = max(self.peak, self.allocated + peak)
            self.reserved += kept
            self.used += kept + outside
            return scaffolding
        return run

    def mem_get_info(self):
        return self.total - self.used, self.total

    def memory_allocated(self):
        return self.allocated

    def max_memory_allocated(self):
        return self.peak

    def memory_reserved(self):
        return self.reserved

    def reset_peak_memory_stats(self):
        self.calls.append("reset")
        self.peak = self.allocated

    def synchronize(self):
        pass

    def empty_cache(self):
        self.calls.append("empty")
        self.used -= self.reserved - self.allocated
        self.reserved = self.allocated


def test_the_kv_cache_gets_what_the_largest_steps_leave():
    memory = FakeMemory(total=80 * GIB, in_use=20 * GIB, allocated=16 * GIB)  # 16 GiB of weights, 4 of context
    profile = profile_steps(memory, [memory.step(peak=6 * GIB, kept=6 * GIB, outside=GIB // 2, scaffolding=GIB),
                                     memory.step(peak=GIB // 2)])
    assert profile.step_peaks == (5 * GIB, GIB // 2)  # the first step's own KV cache is not reserved
    assert profile.in_use == 20 * GIB and profile.outside_allocator == GIB // 2
    # 0.9 x 80 = 72 GiB; minus 20 in use, 5 + 0.5 for the steps' peaks, 0.5 outside the allocator
    assert profile.kv_cache_bytes(0.9) == 46 * GIB
    assert memory.calls == ["empty", "reset", "step", "reset", "step", "empty"]  # each peak is the step's own
    with pytest.raises(ValueError, match=r"no memory is left for the KV cache: gpu_memory_utilization 0.3 allows "
                                         r"24.00 GiB of the GPU's 80.00 GiB; 20.00 GiB are in use .* 6.00 GiB more"):
        profile.kv_cache_bytes(0.3)


def test_the_cuda_platform_profiles_the_runner_and_defaults_to_bfloat16(tiny_llama):
    memory = FakeMemory(total=80 * GIB, in_use=10 * GIB, allocated=8 * GIB)
    platform = CudaPlatform(torch.device("cpu"), memory)
    config = EngineConfig(model=tiny_llama, gpu_memory_utilization=0.5)
    assert platform.kv_cache_budget(config, [memory.step(peak=2 * GIB)]) == 28 * GIB
    assert platform.last_profile.step_peaks == (2 * GIB,)
    assert platform.kv_cache_budget(config) == 30 * GIB  # a parallel rank: not profiled
    model_cfg = open_checkpoint(tiny_llama).config
    for checkpoint_dtype, expected in (("float32", torch.bfloat16), ("bfloat16", torch.bfloat16),
                                       (None, torch.bfloat16), ("float16", torch.float16)):
        assert platform.default_dtype(dataclasses.replace(model_cfg, torch_dtype=checkpoint_dtype)) == expected


def test_split_tokens_fills_the_budget_over_the_most_sequences():
    assert split_tokens(2048, 256, 4096) == [8] * 256
    assert split_tokens(10, 4, 100) == [3, 3, 2, 2]
    assert split_tokens(3, 8, 100) == [1, 1, 1]
    assert split_tokens(5000, 1, 2048) == [1667, 1667, 1666]  # no sequence past the context length


def test_the_runner_profiles_its_largest_step_and_its_largest_captured_decode(tiny_llama, monkeypatch):
    """On the CPU with CUDA's platform (a fake memory API) and stand-in graphs: the engine profiles the whole
    token budget over max_num_seqs sampled sequences, then the largest decode a graph holds, and sizes its
    KV cache from the profile."""
    memory = FakeMemory(total=GIB, in_use=GIB // 8, allocated=GIB // 16)
    platform = CudaPlatform(torch.device("cpu"), memory)
    capture = EagerCapture()
    monkeypatch.setattr(platform, "graph_capture", lambda: capture)
    monkeypatch.setattr(model_runner, "platform_for", lambda device: platform)
    steps = []
    execute = ModelRunner.execute

    def spy(self, batch):
        steps.append((len(batch.input_ids), len(batch.sampling_seqs), bool(batch.meta.prefills)))
        return execute(self, batch)

    monkeypatch.setattr(ModelRunner, "execute", spy)
    config = EngineConfig(model=tiny_llama, device="cpu", dtype="float32", max_num_seqs=6,
                          max_num_batched_tokens=40, gpu_memory_utilization=0.5)
    runner = ModelRunner(config)
    assert steps[:2] == [(40, 6, True), (6, 6, False)]  # the largest step, then the largest captured decode
    assert memory.calls == ["empty", "reset", "reset", "empty"] and capture.captured == [6, 4, 2, 1]
    assert runner.num_blocks == platform.last_profile.kv_cache_bytes(0.5) // runner.kv_bytes_per_block()
    assert runner.kv_caches[0].shape[1] == runner.num_blocks + 1


def test_profiling_steps_free_their_own_kv_cache(tiny_llama):
    runner = ModelRunner(EngineConfig(model=tiny_llama, kv_cache_memory_gib=0.01, max_num_seqs=3,
                                      max_num_batched_tokens=20))
    with torch.inference_mode():
        scaffolding = largest_step(runner)()
    assert runner.kv_caches == [] and scaffolding == 3 * -(-7 // 16) * runner.kv_bytes_per_block()
    with torch.inference_mode():
        assert largest_decode(runner, 5)() == 5 * runner.kv_bytes_per_block()
