"""Each `routing.policy` name is a preset of scorer weights (docs/gateway.md, Routing).

Weights are relative: the picker takes the highest weighted sum of scores in [0, 1]. A small weight
only breaks ties: `kv_cache` at 0.01 can outweigh a difference of one request in flight only between
upstreams whose loads span more than 100 requests.
"""

from __future__ import annotations

PRESETS: dict[str, dict[str, float]] = {
    # No scorer: every upstream ties and the picker's rotation gives each its turn.
    "round_robin": {},
    # The fewest requests (in flight + waiting at the replica); the most free KV cache breaks ties.
    "least_load": {"load": 1.0, "kv_cache": 0.01},
    # The longest cached prefix first (longer by more than 1% of the prompt outweighs any load
    # difference), within the balance gate; then least load; then the upstream holding the least cache.
    "prefix": {"prefix": 100.0, "load": 1.0, "cache_spread": 0.01},
    # The session's upstream on the bounded-load ring always outweighs load; no session key: least load.
    "session": {"session": 2.0, "load": 1.0, "kv_cache": 0.01},
    # Least load inside the pool the length-class filter chose (that filter applies to any policy).
    "length_classes": {"load": 1.0, "kv_cache": 0.01},
}
POLICY_NAMES = tuple(PRESETS)
