"""Pipeline parallelism with P micro-batches in flight (CPU, gloo): stage 0 starts batch k+1 while stage 1
runs batch k; greedy output stays token-identical to one process, also when the KV cache is so small
that sequences are preempted, and when a request is aborted while its micro-batch is in flight."""

import pytest

from argosy import LLM
from argosy.engine.checkpoint import load_model_config
from argosy.engine.random_model import make_random_model
from tests.test_parallel import KV_GIB, generate, greedy, prompts_for, reference


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = str(make_random_model(tmp_path_factory.mktemp("pp-llama"), arch="llama", init_std=0.2))
    return path, reference(path, prompts_for())[0]


def run_by_steps(llm: LLM, prompts, abort: str | None = None) -> tuple[dict[str, list[int]], int]:
    """Steps the engine by hand; returns each request's tokens and the most micro-batches seen in flight,
    checking that no sequence is ever in two of them. abort: a request aborted while in flight."""
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, greedy())
    tokens, most = {}, 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        # step() finished the oldest batch; the ones left were in flight beside it.
        most = max(most, len(engine._in_flight) + 1)
        seqs = [s for out, *_ in engine._in_flight for s, _ in out.scheduled]
        assert len(seqs) == len(set(seqs)), "a sequence is in two micro-batches in flight"
        for out in outputs:
            if out.finished:
                tokens[out.request_id] = out.outputs[0].token_ids
        if abort is not None and any(s.request_id == abort for s in seqs):
            engine.abort_request(abort)
            abort = None
    assert abort is None, "the request to abort was never in flight"
    return tokens, most


def test_two_micro_batches_in_flight_match_one_process(llama):
    path, expected = llama
    prompts = prompts_for()
    # A 16-token budget: chunked prefill, several micro-batches per prompt wave.
    with LLM(path, kv_cache_memory_gib=KV_GIB, max_num_batched_tokens=16, pipeline_parallel_size=2) as llm:
        assert llm.engine.pipeline_depth == 2
        tokens, most = run_by_steps(llm, prompts)
        assert most == 2
        assert [tokens[str(i)] for i in range(len(prompts))] == expected
        hits = llm.engine.kv.hits
        tokens, _ = run_by_steps(llm, prompts)  # again: prefix-cache hits, blocks cached by batches in flight
        assert [tokens[str(i)] for i in range(len(prompts))] == expected
        assert llm.engine.kv.hits - hits >= 16 * len(prompts)
        llm.engine.kv.check_integrity()
        assert llm.engine.kv.num_free_blocks == llm.engine.runner.num_blocks


def test_preemption_and_abort_with_batches_in_flight(llama):
    path, expected = llama
    prompts = prompts_for()
    cfg = load_model_config(path)
    # One stage's share: K and V of one of the two layers, float32 on the CPU.
    block_bytes = 2 * (cfg.num_layers // 2) * 16 * cfg.num_kv_heads * cfg.head_dim * 4
    # Ten blocks for the 13 the four requests need at the end: the newest is preempted and recomputed.
    with LLM(path, kv_cache_memory_gib=10 * block_bytes / 2**30, max_num_batched_tokens=16,
             pipeline_parallel_size=2) as llm:
        assert llm.engine.runner.num_blocks == 10
        assert generate(llm, prompts) == expected
        assert llm.engine.scheduler.num_preemptions > 0
        llm.engine.kv.check_integrity()
        # Aborting request 3 while its micro-batch is in flight: its result is dropped, the others are exact.
        tokens, _ = run_by_steps(llm, prompts, abort="3")
        assert "3" not in tokens
        assert [tokens[str(i)] for i in range(3)] == expected[:3]
        llm.engine.kv.check_integrity()
        assert llm.engine.kv.num_free_blocks == llm.engine.runner.num_blocks


def test_scheduler_never_schedules_or_preempts_a_sequence_in_flight():
    from argosy import SamplingParams
    from argosy.engine.kv_cache_manager import KVCacheManager
    from argosy.engine.scheduler import Scheduler
    from argosy.engine.sequence import Sequence, SequenceStatus

    sched = Scheduler(KVCacheManager(num_blocks=4, block_size=4), max_num_seqs=8, token_budget=64)
    a, b = (Sequence(r, list(range(10 * k, 10 * k + 8)), SamplingParams()) for k, r in ((1, "a"), (2, "b")))
    sched.add(a)
    sched.add(b)
    assert [s for s, _ in sched.schedule().scheduled] == [a, b]  # all four blocks in use
    for seq in (a, b):  # their batch ran; each sampled a token, so each needs a fifth slot: a third block
        seq.num_computed_tokens = 8
        seq.append_token(1)
    # b is in flight: a gets nothing to preempt but itself, although b (the newest) is the usual victim.
    out = sched.schedule(in_flight={b})
    assert out.preempted == [a] and out.scheduled == [] and b.status is SequenceStatus.RUNNING
    assert b.num_computed_tokens == 8 and len(b.block_ids) == 2
    # With b in flight a is not readmitted either: b holds its blocks, and nothing of b's is taken.
    assert sched.schedule(in_flight={b}).scheduled == [] and len(b.block_ids) == 2
    # Without anything in flight, the same state preempts the newest (b), as before.
    sched2 = Scheduler(KVCacheManager(num_blocks=4, block_size=4), max_num_seqs=8, token_budget=64)
    c, d = (Sequence(r, list(range(10 * k, 10 * k + 8)), SamplingParams()) for k, r in ((1, "c"), (2, "d")))
    sched2.add(c)
    sched2.add(d)
    sched2.schedule()
    for seq in (c, d):
        seq.num_computed_tokens = 8
        seq.append_token(1)
    assert sched2.schedule().preempted == [d]
