"""`argosy profile --model PATH`: time the real engine's steps on this device and fit a StepProfile.

Three sweeps, each step timed around LLMEngine.step(): prefills of P tokens alone, decode steps of B
sequences at two context lengths (so the KV term separates from the batch term), and mixed steps (a
prefill chunk beside decodes). A least-squares fit, with coefficients kept >= 0, gives
step = base + a * prefill_tokens + b * decode_seqs + c * kv_tokens + d * prefill_attention (query tokens x
their context: a prompt's attention grows with its square), refitted once without outliers. Cold start
is the time to load the engine and run its first step, in this process (a replica's process start and
imports come on top). Last, decode steps after one, two and three replicas' worth of weights went
through the cache: what a step costs more beside neighbours on a shared node (neighbour_step_table), and
what the serving work outside the engines (each chunk built, relayed, read) costs more there
(node_neighbour_table). Then the node's time slice: decode steps timed beside a busy thread on every core
(time_slice_s).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import statistics
import time
from collections.abc import Callable

import numpy as np

from argosy.engine.config import EngineConfig
from argosy.engine.llm_engine import LLMEngine
from argosy.engine.sampling_params import SamplingParams
from argosy.sim.measure_node import spinning_on_every_core
from argosy.sim.profile import StepProfile, model_shape

NEIGHBOURS = (1, 2, 3)  # replicas' worth of weights through the cache between two steps
NEIGHBOUR_CAP_BYTES = 256 << 20

Obs = tuple[int, int, int, int, float]  # prefill tokens, decode sequences, KV tokens, prefill attention, seconds


class _Prober:
    def __init__(self, engine: LLMEngine, seed: int = 0):
        self.engine, self.rng, self.ids = engine, random.Random(seed), itertools.count()
        self.vocab = engine.vocab_size

    def prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(n)]  # random: no prefix-cache hits

    def add(self, n_prompt: int, max_tokens: int) -> str:
        rid = f"p{next(self.ids)}"
        self.engine.add_request(rid, self.prompt(n_prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        return rid

    def decoding(self, batch: int, context: int) -> None:
        """`batch` sequences of `context` prompt tokens, stepped until every one is prefilled and decoding."""
        for _ in range(batch):
            self.add(context, self.engine.max_model_len - context)
        sched = self.engine.scheduler
        while any(s.num_output_tokens == 0 for s in sched.running) or len(sched.waiting):
            self.engine.step()

    def timed_step(self) -> float:
        t = time.perf_counter()
        self.engine.step()
        return time.perf_counter() - t

    def clear(self) -> None:
        for rid in list(self.engine.requests):
            self.engine.abort_request(rid)


def _weight_bytes(engine: LLMEngine) -> int:
    model = getattr(engine.runner, "model", None)
    if model is None:
        return 0
    return sum(t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers()))


def _neighbour_buffer(nbytes: int) -> np.ndarray:
    """What `nbytes` of neighbours' weights read through the cache stands in for (capped: past any
    last-level cache, more evicts nothing more)."""
    return np.ones(max(min(nbytes, NEIGHBOUR_CAP_BYTES) // 8, 1))


# After a neighbour's weights went through the cache, a step is slowest at once and back to its back-to-back
# time about six steps on (measured on the 2-core host): each cycle times the first step and, as its baseline,
# the last RECOVERED of STEPS_PER_CYCLE. Cycles of a few ms leave the host's drift out: timed in blocks (all
# steps alone, then all after neighbours), one profile read +0.00 ms after 1 and 2 where the next read +0.38
# and +0.61, and back-to-back blocks a second apart took 2.8 and 1.7 ms.
STEPS_PER_CYCLE, RECOVERED = 10, 4


def _after_neighbours(buffer: np.ndarray, timed: Callable[[], float], cycles: int) -> list[tuple[float, float]]:
    """`cycles` of (the first timed() run after `buffer` was read through the cache, the median of the last
    RECOVERED of STEPS_PER_CYCLE runs after it)."""
    pairs = []
    for _ in range(cycles):
        buffer.sum()  # every byte read, as a neighbour's step reads its weights
        times = [timed() for _ in range(STEPS_PER_CYCLE)]
        pairs.append((times[0], statistics.median(times[-RECOVERED:])))
    return pairs


def _neighbour_sweep(engine: LLMEngine, probe: _Prober, batch: int, repeats: int) -> tuple[tuple[float, float], ...]:
    """Decode steps of `batch` sequences right after n replicas' worth of weights went through the cache (a
    buffer streamed as a neighbour's step reads its weights), less the same steps once back to their
    back-to-back time: (n, seconds) for n in NEIGHBOURS, the median over cycles. What packing replicas onto one
    node costs each step, from one replica."""
    size = _weight_bytes(engine)
    if size == 0:
        return ()
    rows = []
    for n in NEIGHBOURS:
        probe.decoding(batch, 32)
        probe.timed_step()  # the first step after the prefills is a warm-up
        cycles = _after_neighbours(_neighbour_buffer(n * size), probe.timed_step, 4 * repeats)
        probe.clear()
        rows.append((float(n), max(statistics.median(first - steady for first, steady in cycles), 0.0)))
    return tuple(rows)


def _serving_path(tokens: int = 16) -> int:
    """A stand-in for the node's work on `tokens` streamed tokens outside the engines: the replica builds
    each OpenAI chunk, the gateway scans it for events, the client parses it (plain Python, as they are)."""
    seen = 0
    for i in range(tokens):
        body = {"id": f"cmpl-{i:08x}", "object": "text_completion", "created": 1733400000 + i, "model": "m",
                "choices": [{"index": 0, "text": " token", "logprobs": None, "finish_reason": None}]}
        event = b"data: " + json.dumps(body).encode() + b"\n\n"
        seen += event.count(b"data: ")
        seen += len(json.loads(event[6:])["choices"][0]["text"])
    return seen


def _node_neighbour_sweep(engine: LLMEngine, repeats: int) -> tuple[tuple[float, float], ...]:
    """The serving path's time right after n replicas' worth of weights went through the cache, over its time
    once recovered (as for steps, in cycles): (n, ratio) for n in NEIGHBOURS, the median over cycles. On a
    packed node the gateway's, the event loops' and the client's work on each chunk finds the engines' weights
    where its own code and data were."""
    size = _weight_bytes(engine)
    if size == 0:
        return ()

    def timed_serving_path() -> float:
        t = time.perf_counter()
        _serving_path()
        return time.perf_counter() - t

    for _ in range(40):  # a warm-up
        timed_serving_path()
    rows = []
    for n in NEIGHBOURS:
        cycles = _after_neighbours(_neighbour_buffer(n * size), timed_serving_path, 12 * repeats)
        rows.append((float(n), statistics.median(first / steady for first, steady in cycles)))
    return tuple(rows)


SLICE_STEPS = 300  # decode steps of one sequence (about 2 ms each) timed alone and again beside busy threads


def slice_from_steps(alone, shared) -> float:
    """The node's time slice, from decode steps timed alone and beside a busy thread on every core. A step
    that had to share its core ran at full speed, then waited while another thread had the core for a
    slice: the stretched steps stand apart from the rest by about one slice (a step shorter than a slice
    loses one at most, most often), so the slice is the median of their stretch, which a rare stall does
    not move. 0 where too few steps were stretched to tell (cores to spare)."""
    alone, shared = np.asarray(alone, dtype=float), np.asarray(shared, dtype=float)
    base = float(np.median(alone))
    noise = float(np.percentile(alone, 99)) - base
    stretch = shared - base
    lost = stretch[stretch > 2 * noise + 1e-4]
    if len(lost) < 0.02 * len(shared):
        return 0.0
    return float(np.median(lost))


def _time_slice(probe: _Prober) -> tuple[float, float]:
    """(the slice, the share of steps that lost one) from SLICE_STEPS decode steps timed alone (before and
    after) and beside a spinning process on every core this process may run on."""

    def steps() -> list[float]:
        probe.decoding(1, 32)
        times = [probe.timed_step() for _ in range(SLICE_STEPS + 1)][1:]  # the first: a warm-up
        probe.clear()
        return times

    alone = steps()
    with spinning_on_every_core(idle_priority=False):
        time.sleep(0.5)  # every one of them spinning
        shared = steps()
    alone += steps()
    q = slice_from_steps(alone, shared)
    share = float(np.mean(np.asarray(shared) - statistics.median(alone) > q / 2)) if q else 0.0
    return q, share


def _nnls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least squares with coefficients kept >= 0 by dropping the most negative one until none is."""
    active = list(range(x.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active] * w[:, None], y * w, rcond=None)
        if (coef >= 0).all():
            break
        active.pop(int(np.argmin(coef)))
    full = np.zeros(x.shape[1])
    full[active] = coef
    return full


def _fit(obs: list[Obs]) -> tuple[list[float], float, int]:
    """The coefficients, the mean relative error of the fit, and how many outliers were left out."""
    x = np.array([[1.0, p, d, kv, a] for p, d, kv, a, _ in obs])
    y = np.array([t for *_, t in obs])
    # Relative errors (a 5 ms decode step counts as much as a 100 ms prefill), and each kind of step
    # (prefill only, decode only, mixed) weighs the same in all, however many of it were measured.
    kind = [(p > 0) + 2 * (d > 0) for p, d, *_ in obs]
    w = np.array([1.0 / (t * kind.count(k)) for k, (*_, t) in zip(kind, obs, strict=True)])
    coef = _nnls(x, y, w)
    # One refit without the outliers (a cache cliff, a noisy neighbour): a few steps far off the line
    # would otherwise tilt it for every step near it.
    rel = np.abs(x @ coef - y) / y
    keep = rel <= max(3 * float(np.median(rel)), 0.05)
    if keep.sum() >= x.shape[1] + 3 and not keep.all():
        coef = _nnls(x[keep], y[keep], w[keep])
    err = float(np.mean((np.abs(x @ coef - y) / y)[keep]))
    return [float(c) for c in coef], err, int((~keep).sum())


def measure_profile(model: str, *, max_num_seqs: int = 64, token_budget: int = 512, kv_cache_memory_gib: float = 0.5,
                    repeats: int = 3, log: Callable[[str], None] = print) -> StepProfile:
    t0 = time.perf_counter()
    cfg = EngineConfig(model=model, device="cpu", max_num_seqs=max_num_seqs, max_num_batched_tokens=token_budget,
                       kv_cache_memory_gib=kv_cache_memory_gib)
    engine = LLMEngine(cfg)
    probe = _Prober(engine)
    probe.add(8, 1)
    while engine.has_unfinished_requests():
        engine.step()
    cold_start = time.perf_counter() - t0
    log(f"cold start (load + first step): {cold_start:.2f} s")
    obs: list[Obs] = []
    table: list[tuple[float, float, float]] = []  # decode-only steps: batch, context, median seconds
    longest = min(token_budget, engine.max_model_len - 1)  # a prompt leaves room for one token
    prefill_sizes = sorted({s for s in (16, 64, 128, 256, longest // 2, longest) if s <= longest})
    prefills: list[tuple[float, float]] = []  # prefill-only steps from an empty context: tokens, median seconds
    for p in prefill_sizes:
        times = []
        for _ in range(2 * repeats):
            probe.add(p, 1)
            times.append(probe.timed_step())
            probe.clear()
        obs.append((p, 0, p, p * (p + 1) // 2, statistics.median(times)))
        prefills.append((p, statistics.median(times)))
    log(f"prefill sweep: {len(prefill_sizes)} sizes up to {longest} tokens")
    batches = sorted({b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= max_num_seqs})
    for ctx in (32, min(256, engine.max_model_len // 2)):
        for b in batches:
            # Only batches whose sequences all fit in the KV cache through the timed steps: beyond that the
            # engine preempts, and the step would time recomputed prefills (the sim preempts on its own).
            if b * -(-(ctx + 3 * repeats + 2) // cfg.block_size) > engine.kv.num_blocks:
                log(f"decode sweep: batch {b} at {ctx} tokens of context does not fit the KV cache; not timed")
                continue
            probe.decoding(b, ctx)
            times = []
            for k in range(3 * repeats + 1):  # decode steps are short and cheap: time more of them
                kv = sum(s.num_tokens for s in engine.scheduler.running)
                t = probe.timed_step()
                if k:  # the first decode step after the prefills is a warm-up
                    obs.append((0, b, kv, 0, t))
                    times.append(t)
            table.append((b, ctx, statistics.median(times)))
            probe.clear()
        log(f"decode sweep at {ctx} tokens of context: batches {batches[0]}..{batches[-1]}")
    for b in batches[: max(1, len(batches) - 1)]:
        chunk = max(16, longest - b)
        probe.decoding(b, 32)
        probe.add(chunk, 1)
        kv = sum(s.num_tokens for s in engine.scheduler.running) + chunk
        obs.append((chunk, b, kv, chunk * (chunk + 1) // 2, probe.timed_step()))
        probe.clear()
    log(f"mixed steps: {len(batches) - 1} batches with a prefill chunk")
    (base, per_tok, per_seq, per_kv, per_attn), err, outliers = _fit(obs)
    log(f"fit: step = {base * 1e3:.3f} ms + {per_tok * 1e6:.2f} us/prefill token + {per_seq * 1e6:.1f} "
        f"us/decode seq + {per_kv * 1e9:.2f} ns/KV token + {per_attn * 1e9:.3f} ns/prefill query x context token "
        f"(mean error {err * 100:.1f}%; {outliers} of {len(obs)} steps left out as outliers)")
    neighbours = _neighbour_sweep(engine, probe, min(4, max_num_seqs), repeats)
    if neighbours:
        log("steps beside neighbours (their weights through the cache between two steps): "
            + ", ".join(f"{t * 1e3:+.2f} ms after {n:g}" for n, t in neighbours))
    node_neighbours = _node_neighbour_sweep(engine, repeats)
    if node_neighbours:
        log("serving work outside the engines beside neighbours (chunks built, relayed, read): "
            + ", ".join(f"x{r:.2f} after {n:g}" for n, r in node_neighbours))
    time_slice, sliced = _time_slice(probe)
    log(f"the node's time slice beside a busy thread on every core: {time_slice * 1e3:.2f} ms "
        f"({sliced:.0%} of {SLICE_STEPS} steps lost one)")
    engine.close()
    params = None
    with contextlib.suppress(ValueError, KeyError):  # a checkpoint without a config.json: size unknown
        params = model_shape(str(model)).params
    return StepProfile(
        name=f"{model} on this CPU (measured)", gpu="cpu", source="measured", combine="sum", base_s=base,
        per_prefill_token_s=per_tok, per_decode_seq_s=per_seq, mem_base_s=0.0, per_kv_token_s=per_kv,
        per_prefill_attn_s=per_attn, decode_table=tuple(table), prefill_table=tuple(prefills),
        num_blocks=engine.kv.num_blocks, block_size=cfg.block_size, cold_start_s=cold_start,
        neighbour_step_table=neighbours, node_neighbour_table=node_neighbours, time_slice_s=time_slice,
        notes={"max_num_seqs": max_num_seqs, "token_budget": token_budget, "fit_mean_rel_error": err, "params": params,
               "fit_outliers": outliers,
               "observations": [list(o) for o in obs]})
