"""`argosy profile --model ENCODER`: an encoder replica's batch times on this device, as a StepProfile.

Batches of inputs of several lengths and counts run through the real engine (EncoderEngine.run_batch);
the fit is  step = base + a * tokens + b * sum(input length^2)  (the linear layers grow with the tokens,
attention with each input's length squared), by least squares on the fastest of `repeats` timings (the
least disturbed by whatever else the machine runs).
The profile's prefill terms carry it (decode terms are zero); `argosy sim` and `argosy plan` read it for
a model of kind embed or rerank (EncoderSimReplica).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from argosy.sim.profile import StepProfile


def measure_encoder_profile(model: str, *, token_budget: int = 4096, repeats: int = 5,
                            log: Callable[[str], None] = print) -> StepProfile:
    from argosy.encoder.config import EncoderConfig
    from argosy.encoder.engine import EncoderEngine
    from argosy.encoder.scheduler import EncodeItem, EncodeRequest
    from argosy.models.packaged import resolve_checkpoint

    model = resolve_checkpoint(model)
    t0 = time.perf_counter()
    engine = EncoderEngine(EncoderConfig(model=model, device="cpu", max_num_batched_tokens=token_budget))
    pad = engine.tokenizer.pad_id

    def batch(length: int, count: int) -> list[EncodeItem]:
        req = EncodeRequest("probe", count, length * count)
        return [EncodeItem(req, i, [pad] * length) for i in range(count)]

    engine.run_batch(batch(8, 1))
    cold_start = time.perf_counter() - t0
    log(f"cold start (load + first batch): {cold_start:.2f} s")
    longest = engine.max_model_len
    lengths = sorted({n for n in (16, 64, 128, 256, longest) if n <= longest})
    rows = []  # (tokens, sum of squared lengths, seconds)
    for length in lengths:
        for tokens in sorted({length, min(4 * length, token_budget), max(token_budget // 4, length), token_budget}):
            count = max(tokens // length, 1)
            items = batch(length, count)
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                engine.run_batch(items)
                times.append(time.perf_counter() - t)
            rows.append((count * length, count * length * length, min(times)))
            log(f"  {count:4d} inputs of {length:4d} tokens: {rows[-1][2] * 1e3:8.2f} ms")
    x = np.array([[1.0, t, a] for t, a, _ in rows])
    y = np.array([s for *_, s in rows])
    base, per_token, per_attn = (max(float(c), 0.0) for c in np.linalg.lstsq(x, y, rcond=None)[0])
    fit = x @ np.array([base, per_token, per_attn])
    err = float(np.mean(np.abs(fit - y) / y))
    log(f"fit: batch = {base * 1e3:.3f} ms + {per_token * 1e6:.2f} us/token + {per_attn * 1e9:.3f} ns/(token x "
        f"input length) (mean error {err * 100:.1f}%)")
    return StepProfile(
        name=f"{Path(model).name} ({engine.kind}) on this CPU (measured)", gpu="cpu", source="measured",
        combine="sum", base_s=base, per_prefill_token_s=per_token, per_decode_seq_s=0.0, mem_base_s=0.0,
        per_kv_token_s=0.0, per_prefill_attn_s=per_attn, num_blocks=1, cold_start_s=cold_start,
        notes={"kind": engine.kind, "token_budget": token_budget, "fit_mean_rel_error": err,
               "observations": [list(r) for r in rows]})
