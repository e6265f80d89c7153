"""CUDA graphs for decode steps (engine/cuda_graphs.py), exercised on the CPU: a stand-in capture that
re-runs the recorded step at each replay checks what the GPU's graphs depend on (the persistent buffers
each step's inputs are copied into, padding rows to the bucket through the spare block, the bucket
choice, which steps are replayed) against the plain path. The CUDA capture itself runs in
bench/gpu_check.py on a GPU."""

from __future__ import annotations

import pytest
import torch

from argosy import LLM, SamplingParams
from argosy.engine import cuda_graphs
from argosy.engine.cuda_graphs import bucket_for, capture_sizes
from argosy.engine.platforms.cpu import CpuPlatform
from tests.test_cpu_kernels import assert_same_outputs


class EagerCapture:
    """A GraphCapture for the CPU: the step's output tensor is kept, and a replay writes the step's result
    for the buffers' current values into it, as a CUDA graph's replay does."""

    def __init__(self):
        self.captured: list[int] = []

    def capture(self, step):
        out = step()
        self.captured.append(out.shape[0])
        return out, lambda: out.copy_(step())


@pytest.fixture
def eager_graphs(monkeypatch):
    capture = EagerCapture()
    monkeypatch.setattr(CpuPlatform, "graph_capture", lambda self: capture)
    return capture


def test_capture_sizes_cover_every_batch_up_to_max_num_seqs():
    assert capture_sizes(256) == list(cuda_graphs.BUCKETS)
    assert capture_sizes(1) == [1]
    assert capture_sizes(10) == [1, 2, 4, 8, 10]
    assert capture_sizes(1000)[-1] == 256  # a larger decode batch runs eagerly
    sizes = capture_sizes(100)
    for n in range(1, 101):
        b = bucket_for(n, sizes)
        assert b >= n and b in sizes and (sizes.index(b) == 0 or sizes[sizes.index(b) - 1] < n)
    assert bucket_for(101, sizes) is None


PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
PROMPTS = [list(range(3, 3 + n)) for n in (5, 9, 23, 40, 7)]  # 5 sequences: replayed padded to 8


def test_decode_steps_replay_the_graph_of_their_bucket_with_the_plain_paths_tokens(tiny_llama, eager_graphs):
    plain = LLM(tiny_llama, kv_cache_memory_gib=0.02, max_num_seqs=8, enforce_eager=True, block_size=8)
    assert plain.engine.runner.graphs is None and eager_graphs.captured == []
    expected = plain.generate(PROMPTS, PARAMS, use_tqdm=False)

    llm = LLM(tiny_llama, kv_cache_memory_gib=0.02, max_num_seqs=8, block_size=8)
    runner = llm.engine.runner
    assert eager_graphs.captured == [8, 4, 2, 1]  # largest first
    assert runner.kv_caches[0].shape[1] == runner.num_blocks + 1  # the spare block padding rows write to
    got = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert_same_outputs(expected, got, 1e-4)
    assert runner.graphs.replays >= PARAMS.max_tokens - 2  # the decode-only steps went through the graphs
    llm.engine.kv.check_integrity()
    # Fewer sequences than before reuse the buffers the larger batch left: stale rows must not leak in.
    assert_same_outputs(expected[:3], llm.generate(PROMPTS[:3], PARAMS, use_tqdm=False), 1e-4)


def test_mixed_steps_and_backends_that_cannot_be_captured_run_eagerly(tiny_llama, eager_graphs):
    llm = LLM(tiny_llama, kv_cache_memory_gib=0.02, max_num_seqs=4, attention_backend="sdpa")
    assert llm.engine.runner.graphs is None and eager_graphs.captured == []  # its decode groups vary in shape
    llm = LLM(tiny_llama, kv_cache_memory_gib=0.02, max_num_seqs=4, max_num_batched_tokens=16)
    runner = llm.engine.runner
    steps, execute = [], runner.execute

    def spy(batch):
        before = runner.graphs.replays
        logits = execute(batch)
        if not batch.meta.prefills:  # a decode-only step: the graph's logits are the plain forward's
            eager = runner.run_model(batch.input_ids, batch.positions, batch.meta)[batch.sample_indices]
            torch.testing.assert_close(logits, eager, atol=1e-5, rtol=1e-5)
        steps.append((bool(batch.meta.prefills), runner.graphs.replays - before))
        return logits

    runner.execute = spy
    llm.generate(PROMPTS[:3], PARAMS, use_tqdm=False)  # chunked prefills of 16 tokens beside decodes
    assert {replayed for prefills, replayed in steps if prefills} == {0}
    assert {replayed for prefills, replayed in steps if not prefills} == {1}
    assert sum(1 for prefills, _ in steps if prefills) >= 3  # 37 prompt tokens, 16 a step
