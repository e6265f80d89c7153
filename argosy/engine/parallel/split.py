"""Whether a model's layers split over `tp` tensor-parallel ranks: the engine's check before it starts any
rank, and the simulator's before it prices a TP size. No torch."""

from __future__ import annotations


def tp_split_problems(num_heads: int, num_kv_heads: int, intermediate_size: int, tp: int) -> list[str]:
    """The sizes `tp` does not divide, named as in config.json (empty: it splits)."""
    problems = []
    if num_heads % tp:
        problems.append(f"num_attention_heads ({num_heads})")
    if intermediate_size % tp:
        problems.append(f"intermediate_size ({intermediate_size})")
    # Fewer KV heads than ranks: each KV head is copied to tp / num_kv_heads ranks, so that must be whole.
    kv_ok = num_kv_heads % tp == 0 if num_kv_heads >= tp else tp % num_kv_heads == 0
    if not kv_ok:
        problems.append(f"num_key_value_heads ({num_kv_heads}; fewer than the ranks must divide them)")
    return problems
