"""An approximate, bounded index of the prompt prefixes the gateway sent to each upstream.

Prompts are cut into blocks of `block_chars` characters and hashed as a chain (each hash covers the
whole prefix up to its block), so "upstream U has block hash h" means "U saw this whole prefix".
Entries live in one LRU (bounded by `max_blocks` over all upstreams) and age out after `ttl_s`: the
index only guesses what the replicas' own prefix caches still hold, so old guesses are dropped.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Iterable


def prefix_hashes(text: str, block_chars: int) -> list[bytes]:
    h = hashlib.blake2b(digest_size=8)  # stable across processes, so gateways can share hashes
    data = text.encode("utf-8", "surrogatepass")
    out = []
    for i in range(0, len(data) - block_chars + 1, block_chars):
        h.update(data[i:i + block_chars])
        out.append(h.digest())
    return out


class PrefixIndex:
    def __init__(self, max_blocks: int = 200_000, ttl_s: float = 600.0, clock=time.monotonic):
        self.max_blocks, self.ttl_s = max_blocks, ttl_s
        self.clock = clock  # the simulator passes its own clock
        self.entries: OrderedDict[bytes, dict[str, float]] = OrderedDict()  # hash -> {upstream: last used}
        self.held: dict[str, int] = {}  # upstream -> entries it holds (how much cache it is guessed to use)

    def match(self, hashes: list[bytes], candidates: Iterable[str]) -> dict[str, int]:
        """Leading blocks of `hashes` each candidate holds (0 for none)."""
        now = self.clock()
        alive = set(candidates)
        result = dict.fromkeys(alive, 0)
        depth = 0
        for h in hashes:
            holders = self.entries.get(h)
            if not holders:
                break
            alive = {u for u in alive if now - holders.get(u, -1e18) < self.ttl_s}
            if not alive:
                break
            depth += 1
            for u in alive:
                result[u] = depth
        return result

    def insert(self, hashes: list[bytes], upstream: str) -> None:
        now = self.clock()
        entries = self.entries
        for h in hashes:
            holders = entries.get(h)
            if holders is None:
                entries[h] = {upstream: now}
                self.held[upstream] = self.held.get(upstream, 0) + 1
            else:
                if upstream not in holders:
                    self.held[upstream] = self.held.get(upstream, 0) + 1
                holders[upstream] = now
                entries.move_to_end(h)
        while len(entries) > self.max_blocks:
            self._drop_oldest()
        # The LRU front is the least recently used entry: drop whatever has aged out from there.
        while entries:
            h, holders = next(iter(entries.items()))
            if now - max(holders.values()) < self.ttl_s:
                break
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, holders = self.entries.popitem(last=False)
        for u in holders:
            self.held[u] -= 1

    def remove_upstream(self, upstream: str) -> None:
        self.held.pop(upstream, None)
        for h in list(self.entries):
            holders = self.entries[h]
            holders.pop(upstream, None)
            if not holders:
                del self.entries[h]

    def __len__(self) -> int:
        return len(self.entries)
