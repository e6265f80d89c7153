"""Tensor and pipeline parallelism on the CPU (gloo): greedy output token-identical to one process, each
rank holding ~1/N of the weights, and a killed worker failing the engine fast."""

import json
import os
import signal
import time

import pytest
import torch

from argosy import LLM, SamplingParams
from argosy.engine.random_model import make_random_model

NEW_TOKENS = 16
KV_GIB = 0.02


def prompts_for(seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 500, (k,), generator=g).tolist() for k in (5, 17, 33, 40)]


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)


def generate(llm: LLM, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(), use_tqdm=False)]


def reference(path: str, prompts) -> tuple[list[list[int]], int]:
    """One process's greedy output and its weights' bytes."""
    llm = LLM(path, kv_cache_memory_gib=KV_GIB)
    weights = sum(p.numel() * p.element_size() for p in llm.engine.runner.model.parameters())
    return generate(llm, prompts), weights


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = str(make_random_model(tmp_path_factory.mktemp("par-llama"), arch="llama", init_std=0.2))
    return path, *reference(path, prompts_for())


def check_parallel(path: str, expected: list[list[int]], total_bytes: int, tp: int, pp: int,
                   extra_bytes: int = 0) -> None:
    """Batched, chunked prefill (16-token budget), then the same prompts again for prefix-cache hits.
    extra_bytes: weights held twice (a tied embedding split over two stages: each end holds its shard)."""
    prompts = prompts_for()
    with LLM(path, kv_cache_memory_gib=KV_GIB, max_num_batched_tokens=16, tensor_parallel_size=tp,
             pipeline_parallel_size=pp) as llm:
        assert generate(llm, prompts) == expected
        hits = llm.engine.kv.hits
        assert generate(llm, prompts) == expected
        assert llm.engine.kv.hits - hits >= 16 * len(prompts)
        # Prompt logprobs: rows of every prefill chunk, gathered from the last stage like the sampled ones.
        scored = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2)
        by_ranks = llm.generate([prompts[3]], scored, use_tqdm=False)[0].prompt_logprobs
        llm.engine.kv.check_integrity()
        assert llm.engine.kv.num_free_blocks == llm.engine.runner.num_blocks
        stats = llm.engine.runner.stats()
    alone = LLM(path, kv_cache_memory_gib=KV_GIB).generate([prompts[3]], scored, use_tqdm=False)[0].prompt_logprobs
    assert len(by_ranks) == len(alone) == len(prompts[3]) and by_ranks[0] is None
    for ours, ref in zip(by_ranks[1:], alone[1:], strict=True):
        assert set(ours) == set(ref)
        assert [ours[t].logprob for t in ref] == pytest.approx([lp.logprob for lp in ref.values()], abs=1e-3)
    assert not any(p.is_alive() for p in llm.engine.runner.procs)  # close() stopped the workers
    assert [s["rank"] for s in stats] == list(range(tp * pp))
    # Each rank holds ~1/N of the weights (the small norms are replicated).
    for s in stats:
        assert s["param_bytes"] / (total_bytes + extra_bytes) == pytest.approx(1 / (tp * pp), abs=0.03), stats


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_llama_matches_one_process(llama, tp, pp):
    check_parallel(*llama, tp, pp)


def test_qwen2_bias_with_fewer_kv_heads_than_ranks(tmp_path):
    # One KV head, two ranks: each rank keeps a replica of it (and its q/k/v bias slices).
    path = str(make_random_model(tmp_path, arch="qwen2", init_std=0.2, num_key_value_heads=1))
    expected, total = reference(path, prompts_for())
    prompts = prompts_for()
    with LLM(path, kv_cache_memory_gib=KV_GIB, max_num_batched_tokens=16, tensor_parallel_size=2) as llm:
        assert generate(llm, prompts) == expected
        assert generate(llm, prompts) == expected
        assert llm.engine.runner.kv_caches[0].shape[3] == 1  # the cache holds this rank's KV head only


def test_tp2_by_pp2_tied_embeddings(tmp_path):
    # Four processes: qwen3 (q/k norms), word embeddings tied across the first and last stage.
    path = str(make_random_model(tmp_path, arch="qwen3", init_std=0.2, tie_word_embeddings=True))
    cfg = json.loads((tmp_path / "config.json").read_text())
    embedding_bytes = cfg["vocab_size"] * cfg["hidden_size"] * 4
    check_parallel(path, *reference(path, prompts_for()), tp=2, pp=2, extra_bytes=embedding_bytes)


def test_sizes_that_do_not_divide_the_model_are_refused_before_starting(llama):
    with pytest.raises(ValueError, match="tensor_parallel_size 3 must divide num_attention_heads"):
        LLM(llama[0], tensor_parallel_size=3)
    with pytest.raises(ValueError, match="exceeds the model's 2 layers"):
        LLM(llama[0], pipeline_parallel_size=3)


def test_killed_worker_fails_the_engine_fast(llama):
    path, expected, _ = llama
    llm = LLM(path, kv_cache_memory_gib=KV_GIB, tensor_parallel_size=2)
    try:
        assert generate(llm, prompts_for()) == expected
        worker = llm.engine.runner.procs[0]
        os.kill(worker.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="tensor-parallel worker 1 exited with code -9"):
            llm.generate(prompts_for(), SamplingParams(max_tokens=200, ignore_eos=True), use_tqdm=False)
        assert time.monotonic() - start < 5
        with pytest.raises(RuntimeError, match="worker 1 exited"):  # and stays failed
            llm.engine.step()
    finally:
        llm.close()
    assert not any(p.is_alive() for p in llm.engine.runner.procs)
