"""The whole engine on the Triton backend (attention, K/V write, RMS norm with the fused residual add, RoPE)
on a tiny model under the interpreter, against the CPU's plain path: the same greedy tokens through
chunked prefills beside decodes, prefix-cache hits, several sequences of one request, and decode steps
replayed from (stand-in) graphs padded to their bucket."""

from __future__ import annotations

from argosy import LLM, SamplingParams
from argosy.engine.platforms.cpu import CpuPlatform
from argosy.engine.platforms.cuda import use_triton_small_ops
from tests.test_cpu_kernels import assert_same_outputs
from tests.test_cuda_graphs import EagerCapture

SHARED = list(range(3, 27))  # 24 tokens: three blocks of 8 another prompt finds in the prefix cache
PROMPTS = [SHARED + [40, 41, 42], [5, 6, 7], SHARED + [50] * 13]
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
SETTINGS = dict(kv_cache_memory_gib=0.005, block_size=8, max_num_batched_tokens=16, max_num_seqs=4)


def test_the_engine_on_triton_kernels_gives_the_plain_paths_tokens(tiny_llama, monkeypatch):
    plain = LLM(tiny_llama, enforce_eager=True, **SETTINGS)
    expected = plain.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert plain.engine.runner.attention.name != "triton"  # the interpreter is never chosen unasked

    # The model as CUDA's platform tunes it (Triton norms and RoPE), and decode graphs captured at start.
    capture, tuned = EagerCapture(), []
    monkeypatch.setattr(CpuPlatform, "graph_capture", lambda self: capture)
    monkeypatch.setattr(CpuPlatform, "tune_model", lambda self, model, *_: tuned.append(use_triton_small_ops(model)))
    llm = LLM(tiny_llama, attention_backend="triton", **SETTINGS)
    runner = llm.engine.runner
    assert runner.attention.name == "triton" and capture.captured == [4, 2, 1] and tuned == [True]
    prefills, execute = [], runner.execute

    def spy(batch):
        if batch.meta.prefills:
            prefills.append((batch.meta.packed_prefills is not None, len(batch.meta.decode_groups)))
        return execute(batch)

    runner.execute = spy
    got = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert_same_outputs(expected, got, 1e-4)
    assert got[2].num_cached_tokens >= 16  # the shared blocks were hits
    assert all(packed for packed, _ in prefills) and any(decodes for _, decodes in prefills)  # mixed steps
    assert runner.graphs.replays > 0
    llm.engine.kv.check_integrity()
