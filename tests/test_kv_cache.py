"""Block pool and KV cache manager: LRU free queue, lazy eviction, prefix caching, integrity."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from argosy.engine.block_pool import BlockPool, FreeBlockQueue, KVCacheBlock, hash_block_tokens
from argosy.engine.kv_cache_manager import KVCacheManager
from argosy.engine.sampling_params import SamplingParams
from argosy.engine.sequence import Sequence

BS = 4
ROOT = Path(__file__).resolve().parents[1]


def make_seq(tokens: list[int], salt: str | None = None, rid: str = "r") -> Sequence:
    return Sequence(request_id=rid, prompt_token_ids=list(tokens), params=SamplingParams(), cache_salt=salt)


def admit(mgr: KVCacheManager, seq: Sequence) -> int:
    """Scheduler-side admission of a whole prompt; returns the tokens hit in the prefix cache."""
    blocks, hit = mgr.get_computed_blocks(seq)
    assert mgr.allocate_slots(seq, seq.num_tokens - hit, blocks)
    seq.num_computed_tokens = seq.num_tokens  # the hit tokens, then the forward pass over the rest
    return hit


def snapshot(mgr: KVCacheManager, *seqs: Sequence) -> tuple:
    pool = mgr.pool
    return ([b.block_id for b in pool.free_queue.walk(pool.num_blocks)],
            [(b.ref_cnt, b.block_hash) for b in pool.blocks], dict(pool.cached_blocks), mgr.num_free_blocks,
            [(list(s.block_ids), list(s.block_hashes), s.num_computed_tokens) for s in seqs])


def test_hash_is_chained_salted_and_stable_across_processes() -> None:
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    h_a = hash_block_tokens(None, a)
    assert hash_block_tokens(None, a) == h_a
    assert hash_block_tokens(h_a, b) != hash_block_tokens(None, b)  # the parent enters the hash
    assert hash_block_tokens(hash_block_tokens(None, [1, 2, 3, 5]), b) != hash_block_tokens(h_a, b)
    salted = {hash_block_tokens(None, a, s) for s in (None, "", "x", "y")}
    assert len(salted) == 4
    # Python's hash() of a str changes with PYTHONHASHSEED; ours must not.
    code = ("from argosy.engine.block_pool import hash_block_tokens as h; "
            "print(h(h(None, [1, 2, 3, 4], 'tenant'), [5, 6, 7, 8]))")
    expected = hash_block_tokens(hash_block_tokens(None, a, "tenant"), b)
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], check=True, text=True, capture_output=True,
                             cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        assert int(out) == expected


def test_free_queue_o1_operations() -> None:
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    q.remove(blocks[2])  # middle
    q.remove(blocks[0])  # head
    q.remove(blocks[4])  # tail
    assert [b.block_id for b in q.walk(5)] == [1, 3]
    q.append(blocks[0])
    assert q.popleft() is blocks[1] and q.popleft() is blocks[3] and q.popleft() is blocks[0]
    assert q.num_free == 0
    with pytest.raises(ValueError):
        q.popleft()
    with pytest.raises(ValueError):
        q.remove(blocks[2])


def test_lru_eviction_order_tail_blocks_of_a_sequence_first() -> None:
    mgr = KVCacheManager(6, BS, enable_prefix_caching=False)
    a, b, c = (make_seq([k] * 2 * BS) for k in (1, 2, 3))
    for s in (a, b, c):
        admit(mgr, s)
    assert mgr.num_free_blocks == 0 and mgr.usage == 1.0
    ids_a, ids_b = list(a.block_ids), list(b.block_ids)
    mgr.free(b)
    mgr.free(a)
    assert mgr.usage == pytest.approx(2 / 6)
    d = make_seq([4] * 3 * BS)
    admit(mgr, d)
    assert d.block_ids == [ids_b[1], ids_b[0], ids_a[1]]
    mgr.check_integrity()


def test_lazy_eviction_keeps_freed_blocks_hittable_until_reused() -> None:
    mgr = KVCacheManager(4, BS)
    prompt = list(range(2 * BS + 1))
    a = make_seq(prompt)
    admit(mgr, a)
    a0, a1, a2 = (mgr.pool.blocks[i] for i in a.block_ids)
    mgr.free(a)
    assert mgr.num_free_blocks == 4 and a0.block_hash is not None and a1.block_hash is not None

    def hits() -> int:
        return mgr.get_computed_blocks(make_seq(prompt))[1]

    assert hits() == 2 * BS
    admit(mgr, make_seq([100] * 2 * BS))  # takes the never-used block, then a2 (partial, uncached)
    assert hits() == 2 * BS
    old_hash = a1.block_hash
    admit(mgr, make_seq([200] * (BS - 1)))  # takes a1: evicted now
    assert a1.block_hash is None and old_hash not in mgr.pool.cached_blocks
    assert hits() == BS
    admit(mgr, make_seq([300]))  # takes a0
    assert hits() == 0
    mgr.check_integrity()


def test_hit_on_free_cached_block_takes_it_out_of_the_free_queue() -> None:
    mgr = KVCacheManager(4, BS)
    prompt = list(range(2 * BS + 1))
    a = make_seq(prompt)
    admit(mgr, a)
    shared = list(a.block_ids[:2])
    mgr.free(a)
    b = make_seq(prompt)
    assert admit(mgr, b) == 2 * BS
    assert b.block_ids[:2] == shared and mgr.num_free_blocks == 1
    for i in shared:
        blk = mgr.pool.blocks[i]
        assert blk.ref_cnt == 1 and blk.prev_free is None and blk.next_free is None
    assert shared[0] not in [x.block_id for x in mgr.pool.free_queue.walk(4)]
    admit(mgr, make_seq([7] * BS))  # the last free block; the shared ones must not be handed out
    assert mgr.num_free_blocks == 0 and mgr.get_computed_blocks(make_seq(prompt))[1] == 2 * BS
    mgr.check_integrity()


def test_two_sequences_sharing_a_prefix_count_references() -> None:
    mgr = KVCacheManager(8, BS)
    prefix = list(range(2 * BS))
    a, b = make_seq(prefix + [50] * BS), make_seq(prefix + [60] * BS)
    admit(mgr, a)
    assert admit(mgr, b) == 2 * BS
    assert a.block_ids[:2] == b.block_ids[:2] and a.block_ids[2] != b.block_ids[2]
    assert [mgr.pool.blocks[i].ref_cnt for i in a.block_ids] == [2, 2, 1]
    assert mgr.num_free_blocks == 4
    mgr.free(a)
    assert [mgr.pool.blocks[i].ref_cnt for i in b.block_ids] == [1, 1, 1] and mgr.num_free_blocks == 5
    assert a.block_ids == [] and a.block_hashes == []
    mgr.check_integrity()
    mgr.free(b)
    assert mgr.num_free_blocks == 8 and mgr.usage == 0.0
    mgr.check_integrity()


@pytest.mark.parametrize("extra, expected_blocks", [(0, 2), (1, 3), (BS - 1, 3)])
def test_last_token_is_always_recomputed(extra: int, expected_blocks: int) -> None:
    mgr = KVCacheManager(16, BS)
    prompt = list(range(3 * BS + extra))
    admit(mgr, make_seq(prompt + [99] * BS))  # caches at least the prompt's full blocks
    blocks, hit = mgr.get_computed_blocks(make_seq(prompt))
    assert len(blocks) == expected_blocks and hit == expected_blocks * BS
    assert mgr.get_computed_blocks(make_seq([0]))[1] == 0


def test_blocks_filled_during_decode_are_cached() -> None:
    mgr = KVCacheManager(8, BS)
    a = make_seq(list(range(BS + 2)))
    admit(mgr, a)
    while a.num_tokens < 2 * BS:  # decode: sample a token, then compute it in the next step
        a.append_token(40 + a.num_tokens)
        assert mgr.allocate_slots(a, 1)
        a.num_computed_tokens += 1
    assert len(a.block_hashes) == 2 and mgr.pool.blocks[a.block_ids[1]].block_hash == a.block_hashes[1]
    assert mgr.get_computed_blocks(make_seq(a.token_ids + [1]))[1] == 2 * BS


def test_cache_salt_isolates_tenants() -> None:
    mgr = KVCacheManager(16, BS)
    prompt = list(range(2 * BS + 1))
    admit(mgr, make_seq(prompt, salt="tenant-a"))
    assert mgr.get_computed_blocks(make_seq(prompt, salt="tenant-a"))[1] == 2 * BS
    assert mgr.get_computed_blocks(make_seq(prompt, salt="tenant-b"))[1] == 0
    assert mgr.get_computed_blocks(make_seq(prompt))[1] == 0
    assert mgr.get_computed_blocks(make_seq(prompt, salt=""))[1] == 0


def test_a_hit_needs_the_whole_prefix_not_just_the_block() -> None:
    mgr = KVCacheManager(16, BS)
    shared_block = [7] * BS
    a, b = make_seq([1] * BS + shared_block + [0]), make_seq([2] * BS + shared_block + [0])
    admit(mgr, a)
    assert admit(mgr, b) == 0
    c = make_seq([2] * BS + shared_block + [5])
    assert admit(mgr, c) == 2 * BS
    assert c.block_ids[:2] == b.block_ids[:2]  # b's copy of the block, whose K/V saw b's prefix


def test_allocation_failure_changes_nothing() -> None:
    mgr = KVCacheManager(4, BS)
    prefix = list(range(2 * BS))
    a = make_seq(prefix + [1])
    admit(mgr, a)
    mgr.free(a)  # 4 free, two of them cached
    # 2 hit blocks sitting in the free queue + 3 new = 5 > 4: touching the hits uses up free blocks.
    b = make_seq(prefix + [2] * 3 * BS)
    blocks, hit = mgr.get_computed_blocks(b)
    assert hit == 2 * BS and mgr.num_blocks_needed(b, b.num_tokens - hit, blocks) == 5
    before = snapshot(mgr, b)
    assert not mgr.allocate_slots(b, b.num_tokens - hit, blocks)
    assert snapshot(mgr, b) == before
    mgr.check_integrity()
    # One block fewer fits exactly.
    c = make_seq(prefix + [3] * 2 * BS)
    assert admit(mgr, c) == 2 * BS and mgr.num_free_blocks == 0
    # A running sequence that needs a block with none free: refused, unchanged.
    c.append_token(5)
    before = snapshot(mgr, c)
    assert not mgr.allocate_slots(c, 1)
    assert snapshot(mgr, c) == before
    mgr.check_integrity()


def test_same_prefix_computed_twice_keeps_the_first_mapping() -> None:
    mgr = KVCacheManager(8, BS)
    prompt = list(range(2 * BS + 1))
    a, b = make_seq(prompt), make_seq(prompt)
    admit(mgr, a)
    assert mgr.allocate_slots(b, b.num_tokens)  # no lookup: as if both were computed in one step
    for i in range(2):
        assert mgr.pool.cached_blocks[a.block_hashes[i]].block_id == a.block_ids[i]
        assert mgr.pool.blocks[b.block_ids[i]].block_hash is None
    assert b.block_hashes == a.block_hashes
    mgr.check_integrity()
    a_ids = list(a.block_ids[:2])
    mgr.free(a)
    mgr.free(b)
    mgr.check_integrity()
    assert [blk.block_id for blk in mgr.get_computed_blocks(make_seq(prompt))[0]] == a_ids


def test_blocks_evicted_between_lookup_and_allocation_are_refused() -> None:
    mgr = KVCacheManager(3, BS)
    prompt = list(range(2 * BS + 1))
    a = make_seq(prompt)
    admit(mgr, a)
    mgr.free(a)
    b = make_seq(prompt)
    blocks, hit = mgr.get_computed_blocks(b)
    evictor = make_seq([9] * 3 * BS)
    admit(mgr, evictor)  # evicts every block, then frees them again: enough free, wrong contents
    mgr.free(evictor)
    with pytest.raises(RuntimeError, match="evicted"):
        mgr.allocate_slots(b, b.num_tokens - hit, blocks)


def test_prefix_caching_disabled() -> None:
    mgr = KVCacheManager(8, BS, enable_prefix_caching=False)
    a = make_seq(list(range(2 * BS + 1)))
    admit(mgr, a)
    b = make_seq(list(range(2 * BS + 1)))
    assert mgr.get_computed_blocks(b) == ([], 0)
    assert mgr.pool.cached_blocks == {} and a.block_hashes == [] and (mgr.queries, mgr.hits) == (0, 0)


def test_statistics_count_tokens_looked_up_and_hit() -> None:
    mgr = KVCacheManager(16, BS)
    prompt = list(range(3 * BS))
    admit(mgr, make_seq(prompt))
    assert (mgr.queries, mgr.hits) == (3 * BS, 0)
    admit(mgr, make_seq(prompt + [1, 2]))
    assert (mgr.queries, mgr.hits) == (6 * BS + 2, 3 * BS)
    mgr.get_computed_blocks(make_seq([77] * BS))
    assert (mgr.queries, mgr.hits) == (7 * BS + 2, 3 * BS)


def test_double_free_raises() -> None:
    pool = BlockPool(2)
    (blk,) = pool.get_new_blocks(1)
    pool.free_blocks([blk])
    with pytest.raises(ValueError):
        pool.free_blocks([blk])
    with pytest.raises(ValueError):
        pool.get_new_blocks(3)


def test_reset_prefix_cache() -> None:
    mgr = KVCacheManager(8, BS)
    prompt = list(range(2 * BS + 1))
    a = make_seq(prompt)
    admit(mgr, a)
    assert mgr.reset_prefix_cache() == 2
    assert mgr.get_computed_blocks(make_seq(prompt))[1] == 0
    mgr.check_integrity()


def test_random_workload_keeps_integrity_and_correct_contents() -> None:
    rng = random.Random(1234)
    mgr = KVCacheManager(24, BS)
    templates = [[rng.randrange(50) for _ in range(rng.randrange(5, 15))] for _ in range(3)]
    kv: dict[int, tuple] = {}  # slot -> what a forward pass wrote there: (salt, tokens up to and incl. t)

    def slot(s: Sequence, t: int) -> int:
        return s.block_ids[t // BS] * BS + t % BS

    def compute(s: Sequence, n: int) -> None:  # the forward pass: write K/V for n tokens
        for t in range(s.num_computed_tokens, s.num_computed_tokens + n):
            kv[slot(s, t)] = (s.cache_salt, tuple(s.token_ids[:t + 1]))
        s.num_computed_tokens += n
        if s.num_computed_tokens == s.num_tokens:
            s.append_token(rng.randrange(50))

    waiting: list[Sequence] = []
    running: list[Sequence] = []
    preemptions = 0
    for step in range(400):
        if rng.random() < 0.5 and len(waiting) + len(running) < 10:
            tokens = rng.choice(templates)[:rng.randrange(2, 15)] + [rng.randrange(50) for _ in range(rng.randrange(4))]
            waiting.append(make_seq(tokens, salt=rng.choice([None, "x"]), rid=str(step)))
        for s in list(running):
            if s.num_tokens > 40 or rng.random() < 0.03:  # finished or aborted
                mgr.free(s)
                running.remove(s)
                continue
            n = min(s.num_tokens - s.num_computed_tokens, rng.randrange(1, 7))
            if not mgr.allocate_slots(s, n):  # preempt: recompute from scratch later
                mgr.free(s)
                s.num_computed_tokens = 0
                running.remove(s)
                waiting.insert(0, s)
                preemptions += 1
                continue
            compute(s, n)
        while waiting:
            s = waiting[0]
            blocks, hit = mgr.get_computed_blocks(s)
            n = min(s.num_tokens - hit, rng.randrange(1, 9))
            if not mgr.allocate_slots(s, n, blocks):
                break
            waiting.pop(0)
            s.num_computed_tokens += hit
            for t in range(hit):  # what the cache hit must hold: this very prefix, under this salt
                assert kv[slot(s, t)] == (s.cache_salt, tuple(s.token_ids[:t + 1]))
            compute(s, n)
            running.append(s)
        mgr.check_integrity()
        refs = [0] * mgr.num_blocks
        for s in running:
            assert len(s.block_ids) * BS >= s.num_computed_tokens
            for i in s.block_ids:
                refs[i] += 1
            for t in range(s.num_computed_tokens):
                assert kv[slot(s, t)] == (s.cache_salt, tuple(s.token_ids[:t + 1]))
        assert refs == [b.ref_cnt for b in mgr.pool.blocks]
    assert mgr.hits > 0 and preemptions > 0  # the workload exercised sharing and memory pressure


@pytest.mark.parametrize("corruption", ["in_use_ref_zero", "free_ref_one", "negative_ref", "map_wrong_block",
                                        "hash_not_in_map", "queued_twice", "back_link", "count"])
def test_integrity_check_detects_corruption(corruption: str) -> None:
    mgr = KVCacheManager(8, BS)
    a, b = make_seq(list(range(2 * BS + 1))), make_seq([9] * (BS + 1))
    admit(mgr, a)
    admit(mgr, b)
    pool = mgr.pool
    used, cached_free = pool.blocks[b.block_ids[0]], pool.blocks[a.block_ids[0]]
    mgr.free(a)  # leaves free cached blocks, free uncached ones and b's blocks in use
    mgr.check_integrity()
    free_queue = pool.free_queue.walk(8)
    if corruption == "in_use_ref_zero":
        used.ref_cnt = 0
    elif corruption == "free_ref_one":
        free_queue[0].ref_cnt = 1
    elif corruption == "negative_ref":
        free_queue[0].ref_cnt = -1
    elif corruption == "map_wrong_block":
        pool.cached_blocks[cached_free.block_hash] = used
    elif corruption == "hash_not_in_map":
        used.block_hash = 12345
    elif corruption == "queued_twice":
        pool.free_queue.append(free_queue[1])
    elif corruption == "back_link":
        free_queue[2].prev_free = free_queue[0]
    elif corruption == "count":
        pool.free_queue.num_free -= 1
    with pytest.raises(AssertionError):
        mgr.check_integrity()
