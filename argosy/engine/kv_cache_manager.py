"""KVCacheManager: prefix-cache lookup, slot allocation and freeing for sequences, over a BlockPool.

Who does what (as in vLLM v1's KVCacheManager and scheduler):
- The scheduler admits a waiting sequence with `blocks, n = get_computed_blocks(seq)`, then at once
  (no other allocation in between, which could evict those blocks) `allocate_slots(seq, num_new,
  blocks)` with num_new counted after the n hit tokens. Only on True does it set
  `seq.num_computed_tokens += n` (and `seq.num_cached_tokens`); on False nothing changed.
- A running sequence gets `allocate_slots(seq, num_new)` each step; after the forward pass the
  scheduler adds num_new to `seq.num_computed_tokens`. The manager never changes num_computed_tokens.
- `free(seq)` on finish, abort and preemption (which must also reset num_computed_tokens to 0).

`seq.block_hashes[i]` is the chained hash of the i-th full block of `seq.token_ids`, filled lazily
(each block hashed once) and possibly running ahead of the blocks cached; tokens only ever append,
so a hash never goes stale.
"""

from __future__ import annotations

from argosy.engine.block_pool import BlockPool, KVCacheBlock, hash_block_tokens
from argosy.engine.sequence import Sequence


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        # Prefix-cache statistics, cumulative (vllm:prefix_cache_queries / vllm:prefix_cache_hits).
        self.queries = 0
        self.hits = 0
        # seq_id -> how many leading blocks of the sequence went through cache_full_blocks, so a
        # decode step only looks at blocks that became full since.
        self._num_cached_blocks: dict[int, int] = {}

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def _hash_blocks(self, seq: Sequence, num_blocks: int) -> list[int]:
        """seq.block_hashes, extended to cover at least the first num_blocks full blocks."""
        hashes, bs = seq.block_hashes, self.block_size
        for i in range(len(hashes), num_blocks):
            parent = hashes[i - 1] if i else None
            hashes.append(hash_block_tokens(parent, seq.token_ids[i * bs:(i + 1) * bs], seq.cache_salt))
        return hashes

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[KVCacheBlock], int]:
        """The longest run of cached blocks matching seq's tokens from the start, and the tokens it covers.

        The last token is always recomputed (its logits are needed), so at most (num_tokens - 1) //
        block_size blocks. Ref counts are untouched: the scheduler may still not admit the sequence.
        Every call counts in the statistics, as in vLLM v1 (a sequence retried counts again).
        """
        if not self.enable_prefix_caching:
            return [], 0
        max_blocks = (seq.num_tokens - 1) // self.block_size
        computed: list[KVCacheBlock] = []
        for i in range(max_blocks):
            # Hash one block at a time: nothing past the first miss is hashed.
            block = self.pool.get_cached_block(self._hash_blocks(seq, i + 1)[i])
            if block is None:
                break
            computed.append(block)
        num_tokens = len(computed) * self.block_size
        self.queries += seq.num_tokens
        self.hits += num_tokens
        return computed, num_tokens

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int,
                          computed_blocks: list[KVCacheBlock] | None = None) -> int:
        """Free blocks allocate_slots would take: new blocks, plus hit blocks now in the free queue."""
        computed = computed_blocks or []
        total = seq.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
        num_new = max(0, -(-total // self.block_size) - len(seq.block_ids) - len(computed))
        return num_new + sum(1 for block in computed if block.ref_cnt == 0)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int,
                       computed_blocks: list[KVCacheBlock] | None = None) -> bool:
        """Makes seq.block_ids cover num_computed_tokens + the hit tokens + num_new_tokens tokens.

        computed_blocks (from get_computed_blocks) only at admission, when seq holds no blocks; they
        go first in seq.block_ids. Blocks that become full with tokens known now are cached at once:
        a step writes all new K/V before any attention reads, so a sequence admitted later in the
        same step may share them. Returns False, changing nothing, when too few blocks are free.
        """
        computed = computed_blocks or []
        bs = self.block_size
        if not computed:
            # Most calls are decodes with room left in the last block and no block newly full: nothing to do.
            total = seq.num_computed_tokens + num_new_tokens
            if total <= len(seq.block_ids) * bs and (not self.enable_prefix_caching or min(
                    total, seq.num_tokens) // bs <= self._num_cached_blocks.get(seq.seq_id, 0)):
                return True
        elif seq.block_ids:
            raise ValueError("computed_blocks are only passed at admission, to a sequence holding no blocks")
        if self.num_blocks_needed(seq, num_new_tokens, computed) > self.pool.num_free_blocks:
            return False
        if computed:
            for i, block in enumerate(computed):
                # A block evicted since get_computed_blocks holds other tokens now: a scheduler bug.
                if i >= len(seq.block_hashes) or block.block_hash != seq.block_hashes[i]:
                    raise RuntimeError(f"prefix-cache block {block.block_id} was evicted between "
                                       "get_computed_blocks and allocate_slots")
            self.pool.touch(computed)
            seq.block_ids.extend(block.block_id for block in computed)
            self._num_cached_blocks[seq.seq_id] = len(computed)
        total = seq.num_computed_tokens + len(computed) * bs + num_new_tokens
        num_new = -(-total // bs) - len(seq.block_ids)
        if num_new > 0:
            seq.block_ids.extend(block.block_id for block in self.pool.get_new_blocks(num_new))
        if self.enable_prefix_caching:
            num_full = min(total, seq.num_tokens) // bs
            num_cached = self._num_cached_blocks.get(seq.seq_id, 0)
            if num_full > num_cached:
                hashes = self._hash_blocks(seq, num_full)[num_cached:num_full]
                self.pool.cache_full_blocks([self.pool.blocks[i] for i in seq.block_ids[num_cached:num_full]], hashes)
                self._num_cached_blocks[seq.seq_id] = num_full
        return True

    def free(self, seq: Sequence) -> None:
        """Releases seq's blocks, tail first into the free queue so a sequence's last blocks are
        evicted before its first ones (which other prompts are likelier to share)."""
        self.pool.free_blocks([self.pool.blocks[i] for i in reversed(seq.block_ids)])
        seq.block_ids = []
        seq.block_hashes = []
        self._num_cached_blocks.pop(seq.seq_id, None)

    def reset_prefix_cache(self) -> int:
        """Forgets all cached hashes (running sequences keep their blocks); returns how many."""
        return self.pool.reset_prefix_cache()

    def check_integrity(self) -> None:
        """Raises AssertionError unless the block pool is consistent; see BlockPool.check_integrity.

        Free (ref 0, queued) + in use (ref > 0) == total; cached-and-free blocks count as free.
        """
        self.pool.check_integrity()
