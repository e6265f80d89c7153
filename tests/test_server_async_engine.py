"""AsyncEngine: the real engine in its own thread, driven from an asyncio loop in this process."""

from __future__ import annotations

import asyncio
import time

import pytest

from argosy.engine.config import EngineConfig
from argosy.engine.errors import InvalidRequestError
from argosy.engine.sampling_params import SamplingParams
from argosy.server.async_engine import AsyncEngine, EngineRequest


def _engine_factory(model: str):
    def make():
        from argosy.engine.llm_engine import LLMEngine

        return LLMEngine(EngineConfig(model=model, kv_cache_memory_gib=0.01, max_model_len=512))

    return make


def _thread_cpu_s(engine: AsyncEngine) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(engine._thread.ident))


async def _started(model: str) -> AsyncEngine:
    engine = AsyncEngine(_engine_factory(model))
    ready = asyncio.get_running_loop().create_future()
    engine.start(on_ready=lambda: ready.set_result(None), on_failed=ready.set_exception)
    await asyncio.wait_for(ready, 120)
    return engine


async def _settled_stats(engine: AsyncEngine) -> dict:
    """The stats once the engine thread went idle (it snapshots them then)."""
    for _ in range(200):
        await asyncio.sleep(0.02)
        if engine.stats["num_running"] == 0 and engine.stats["num_waiting"] == 0:
            return engine.stats
    raise AssertionError(f"engine still busy: {engine.stats}")


def test_idle_engine_thread_sleeps(tiny_llama):
    async def main():
        engine = await _started(tiny_llama)
        try:
            await asyncio.sleep(0.2)
            before = _thread_cpu_s(engine)
            await asyncio.sleep(1.0)
            assert _thread_cpu_s(engine) - before < 0.05  # blocked on its condition, not spinning
        finally:
            await engine.stop()
        assert not engine._thread.is_alive()

    asyncio.run(main())


def test_abort_frees_every_kv_block(tiny_llama):
    async def main():
        engine = await _started(tiny_llama)
        try:
            free_before = (await _settled_stats(engine))["num_free_blocks"]
            params = SamplingParams(max_tokens=400, ignore_eos=True, n=2)
            group = await engine.add([EngineRequest("long", list(range(5, 100)), params)], time.monotonic())
            outputs = await group.next_outputs()
            assert outputs and not outputs[0].finished
            await asyncio.sleep(0.1)
            assert engine.stats["num_free_blocks"] < free_before
            engine.abort(group)
            assert (await _settled_stats(engine))["num_free_blocks"] == free_before
            assert engine.num_waiting() == 0
        finally:
            await engine.stop()

    asyncio.run(main())


def test_an_invalid_request_fails_its_whole_group(tiny_llama):
    async def main():
        engine = await _started(tiny_llama)
        try:
            free_before = (await _settled_stats(engine))["num_free_blocks"]
            params = SamplingParams(max_tokens=8)
            requests = [EngineRequest("ok", [5, 6, 7], params), EngineRequest("bad", [5, 10**9], params)]
            with pytest.raises(InvalidRequestError) as info:
                await engine.add(requests, time.monotonic())
            assert info.value.param == "prompt"
            stats = await _settled_stats(engine)
            assert stats["num_free_blocks"] == free_before and engine.num_waiting() == 0
        finally:
            await engine.stop()

    asyncio.run(main())


def test_concurrent_groups_get_their_own_outputs(tiny_llama):
    async def main():
        engine = await _started(tiny_llama)
        try:
            params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

            async def run(i: int) -> list[int]:
                prompt = [5 + i, 6 + i, 7 + i]
                group = await engine.add([EngineRequest(f"r{i}", prompt, params)], time.monotonic())
                (final,) = await group.wait_finished()
                assert final.request_id == f"r{i}" and final.prompt_token_ids == prompt
                return final.outputs[0].token_ids

            together = await asyncio.gather(*(run(i) for i in range(12)))
            alone = [await run(i) for i in (0, 11)]
            assert all(len(t) == 6 for t in together)
            assert [together[0], together[11]] == alone  # batching does not change greedy outputs
        finally:
            await engine.stop()

    asyncio.run(main())


def test_a_ready_engine_keeps_its_start_up_heap_out_of_later_collections(tiny_llama):
    """A full collection walks every tracked object; a replica's start (torch, the model, the tokenizer)
    leaves about 350,000 of them, 170-390 ms a walk on the test machine. Ready means frozen."""
    import gc

    gc.unfreeze()

    async def main():
        engine = await _started(tiny_llama)
        try:
            assert gc.get_freeze_count() > 10_000, gc.get_freeze_count()
        finally:
            await engine.stop()

    try:
        asyncio.run(main())
    finally:
        gc.unfreeze()
