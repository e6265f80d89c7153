"""What a server builds as it starts (modules, torch, the model, tokenizer tables, routing state) lives as
long as the process, yet every full garbage collection walks all of it. So `argosy engine` and `argosy
serve` collect nothing while they start (`pause_collection`), and once ready move what they built to
the permanent generation (`freeze_startup_heap`), out of the collector's reach, as vLLM, SGLang and Ray
Serve do; objects made later are collected as before.

Measured on the 2-core test machine: a replica's start ran six full collections (150-450 ms each
beside busy replicas) that found 9-60 objects each; a full collection of `argosy serve` mid-serving
took 170-360 ms, a pause for every stream through the gateway. There is no collection before the
freeze: it would cost one more such walk to free those few dozen objects.
"""

from __future__ import annotations

import gc

_paused = False


def pause_collection() -> None:
    """No automatic collection until freeze_startup_heap (a server's first step)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def freeze_startup_heap() -> None:
    """Keep everything alive now out of later collections; collection resumes if pause_collection stopped it."""
    global _paused
    gc.freeze()
    if _paused:
        gc.enable()
        _paused = False
