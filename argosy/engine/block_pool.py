"""KV cache blocks: ref counts, an O(1) LRU free queue and the prefix cache's hash -> block map.

As in vLLM v1 (block_pool.py, kv_cache_utils.py): a block is free when its ref count is 0, and then
it sits in the free queue. Eviction is lazy: a freed full block keeps its hash and stays findable in
the map until it is popped from the queue for reuse, so a later request can still hit it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(slots=True, eq=False)  # eq=False: blocks compare by identity, as list/queue members
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None  # set only while the block is full and in the hash -> block map
    prev_free: KVCacheBlock | None = None  # links of the free queue; None when not queued
    next_free: KVCacheBlock | None = None


def hash_block_tokens(parent_hash: int | None, token_ids: Sequence[int], cache_salt: str | None = None) -> int:
    """The chained hash of one full block: (parent's hash, its token ids, extra keys).

    blake2b over a fixed little-endian encoding, so the value is the same in every process (Python's
    hash() of a str is salted per process). The cache salt enters the first block only: every later
    hash chains from it, so it salts the whole chain.
    """
    h = hashlib.blake2b(digest_size=16)  # 128 bits: collisions are out of reach
    if parent_hash is None:
        if cache_salt is None:
            h.update(b"\x00")
        else:  # a tag and a length prefix keep "no salt", "" and every salt apart
            salt = cache_salt.encode()
            h.update(b"\x01" + struct.pack("<Q", len(salt)) + salt)
    else:
        h.update(b"\x02" + parent_hash.to_bytes(16, "little"))
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return int.from_bytes(h.digest(), "little")


class FreeBlockQueue:
    """Doubly linked list of free blocks: popleft, append and remove from the middle, all O(1).

    The head is evicted first (least recently freed). A deque cannot remove from the middle in O(1),
    which a prefix-cache hit on a free block needs.
    """

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        # Sentinels at both ends: no None checks when linking.
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self.num_free = 0
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail or block is None:
            raise ValueError("no free blocks")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free += 1

    def walk(self, limit: int) -> list[KVCacheBlock]:
        """The queued blocks, head first, checking the links; raises AssertionError on a broken queue."""
        out: list[KVCacheBlock] = []
        node = self._head
        while True:
            nxt = node.next_free
            if nxt is None:
                raise AssertionError(f"free queue broken after block {node.block_id}: no next link")
            if nxt.prev_free is not node:
                raise AssertionError(f"free queue links disagree between blocks {node.block_id} and {nxt.block_id}")
            if nxt is self._tail:
                break
            out.append(nxt)
            if len(out) > limit:  # more entries than blocks exist: a cycle or a duplicate
                raise AssertionError(f"free queue holds more than {limit} entries")
            node = nxt
        if len(out) != self.num_free:
            raise AssertionError(f"free queue holds {len(out)} blocks but counts {self.num_free}")
        return out


class BlockPool:
    """All KV blocks of the cache, the free queue and (with prefix caching) the hash -> block map."""

    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached_blocks: dict[int, KVCacheBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0, cached or not: all of them can be handed out."""
        return self.free_queue.num_free

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (ref count > 0), 0..1."""
        return 1.0 - self.free_queue.num_free / self.num_blocks

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Pops n blocks from the head of the free queue (LRU), evicting their hashes; ref count 1 each."""
        if n > self.free_queue.num_free:
            raise ValueError(f"asked for {n} blocks, {self.free_queue.num_free} free")
        out = []
        for _ in range(n):
            block = self.free_queue.popleft()
            if block.block_hash is not None:  # the lazy eviction happens here
                if self.cached_blocks.get(block.block_hash) is block:
                    del self.cached_blocks[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        return self.cached_blocks.get(block_hash)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Takes a reference on each block (a prefix-cache hit); a free one leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drops a reference on each block; those reaching 0 join the queue's tail in the order
        given, so the first of them will be evicted first."""
        for block in ordered_blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"block {block.block_id} freed more often than taken")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def cache_full_blocks(self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[int]) -> None:
        """Enters each (now full) block in the map under its hash, pairwise.

        A hash already mapped to another block (two sequences computed the same prefix at the same
        time) keeps its mapping; the duplicate block stays uncached and is simply freed later.
        """
        if not self.enable_prefix_caching:
            return
        for block, block_hash in zip(blocks, block_hashes, strict=True):
            if block.block_hash is not None or block_hash in self.cached_blocks:
                continue
            block.block_hash = block_hash
            self.cached_blocks[block_hash] = block

    def reset_prefix_cache(self) -> int:
        """Forgets every cached hash (blocks in use keep their contents and refs); returns how many."""
        for block in self.cached_blocks.values():
            block.block_hash = None
        n = len(self.cached_blocks)
        self.cached_blocks.clear()
        return n

    def check_integrity(self) -> None:
        """Raises AssertionError unless the pool is consistent. O(num_blocks): for tests and debugging.

        Every block is exactly one of free (ref 0, in the queue) or in use (ref > 0, not queued), so
        free + in use == total. "Cached" (hash in the map) is a property overlapping both: a cached
        free block counts as free, since it can be reused.
        """
        queued = self.free_queue.walk(self.num_blocks)
        queued_ids: set[int] = set()
        for block in queued:
            if block.block_id in queued_ids:
                raise AssertionError(f"block {block.block_id} is twice in the free queue")
            if not 0 <= block.block_id < self.num_blocks or self.blocks[block.block_id] is not block:
                raise AssertionError(f"free queue holds a block not in this pool (id {block.block_id})")
            queued_ids.add(block.block_id)
        num_in_use = 0
        for block in self.blocks:
            if block.ref_cnt < 0:
                raise AssertionError(f"block {block.block_id} has ref count {block.ref_cnt}")
            if block.ref_cnt == 0 and block.block_id not in queued_ids:
                raise AssertionError(f"block {block.block_id} has ref count 0 but is not in the free queue")
            if block.ref_cnt > 0:
                num_in_use += 1
                if block.block_id in queued_ids:
                    raise AssertionError(f"block {block.block_id} is in use (ref {block.ref_cnt}) and queued")
            if block.block_hash is not None and self.cached_blocks.get(block.block_hash) is not block:
                raise AssertionError(f"block {block.block_id} holds a hash that does not map to it")
        for block_hash, block in self.cached_blocks.items():
            if not 0 <= block.block_id < self.num_blocks or self.blocks[block.block_id] is not block:
                raise AssertionError(f"the map's hash {block_hash:#x} points at a block not in this pool")
            if block.block_hash != block_hash:
                raise AssertionError(f"the map's hash {block_hash:#x} points at block {block.block_id}, "
                                     f"which holds {block.block_hash}")
        if len(queued) + num_in_use != self.num_blocks:
            raise AssertionError(f"{len(queued)} free + {num_in_use} in use != {self.num_blocks} blocks")
