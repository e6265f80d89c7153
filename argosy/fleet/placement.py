"""Where replicas go: nodes, their GPUs and memory, each replica's need, best-fit decreasing.

A replica needs `gpus` devices with `gib` free on each (weights / GPUs + KV-cache budget + overhead),
or, on the CPU, `gib` of host RAM, plus any custom `resources` (Ray's: name -> amount) its model asks
for; only nodes that offer them take it. Nodes come from the fleet file's `nodes`, else `nvidia-smi`,
else this machine as one GPU-less node whose RAM is what is available now (the Ray provider discovers
its own). The placer never oversubscribes (memory or custom resources); it keeps a model's replicas on
different nodes when it can; a replica it cannot place gets a reason. The same placer serves every
provider (a node's `provider` says which one starts replicas there).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from argosy.config import EngineSection, NodeConfig
from argosy.engine.config import CPU_DEFAULT_KV_GIB  # the engine's own KV budget on the CPU
from argosy.fleet.capacity import CapacityBook

GIB = 1024 ** 3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GPU_OVERHEAD_GIB = 1.0  # CUDA context, activations, allocator slack
CPU_OVERHEAD_GIB = 0.5  # the Python process, torch, activations
GPU_KV_SHARE = 0.9  # with no kv_cache_memory_gib the engine takes 90% of what is free: the whole GPU


@dataclass
class GPU:
    index: int
    model: str
    memory_gib: float
    used_gib: float = 0.0

    @property
    def free_gib(self) -> float:
        return self.memory_gib - self.used_gib


@dataclass
class Node:
    name: str
    provider: str = "local"
    gpus: list[GPU] = field(default_factory=list)
    memory_gib: float = float("inf")  # host RAM for CPU replicas
    used_gib: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)  # custom resources it offers (Ray's)
    used_resources: dict[str, float] = field(default_factory=dict)

    @property
    def free_gib(self) -> float:
        return self.memory_gib - self.used_gib

    def free_resource(self, name: str) -> float:
        return self.resources.get(name, 0.0) - self.used_resources.get(name, 0.0)


@dataclass(frozen=True)
class Need:
    gpus: int  # 0: a CPU replica
    gib: float  # per GPU, or host RAM for a CPU replica
    resources: tuple[tuple[str, float], ...] = ()  # custom resources, sorted (name, amount) pairs

    @staticmethod
    def of(gpus: int, gib: float, resources: dict[str, float] | None = None) -> Need:
        return Need(gpus, gib, tuple(sorted((resources or {}).items())))

    def size(self) -> float:
        return max(self.gpus, 1) * self.gib


@dataclass(frozen=True)
class Placement:
    node: str
    gpus: tuple[int, ...]  # GPU indices on that node
    need: Need  # per stage when the replica spans nodes
    stages: tuple[tuple[str, tuple[int, ...]], ...] = ()  # a replica across nodes: its other stages' (node, GPUs)

    def parts(self) -> list[tuple[str, tuple[int, ...]]]:
        """(node, GPU indices) of each stage, the first (the leader) at `node`."""
        return [(self.node, self.gpus), *self.stages]


class Unplaceable(Exception):
    """No node can take the replica; the message says why."""


OOM_GROWTH = 1.25  # an estimate that proved short at load grows by a quarter (at least 1 GiB) per failure


class OutOfMemoryAtLoad(RuntimeError):
    """A replica ran out of memory while loading: `corrected` is the need to place it with from now on,
    and the GPUs of `placement` are tried last for this model."""

    def __init__(self, message: str, placement: Placement, corrected: Need):
        super().__init__(message)
        self.placement, self.corrected = placement, corrected


def corrected_need(need: Need) -> Need:
    if need.gib == float("inf"):
        return need  # already whole GPUs: nothing to correct
    return Need(need.gpus, round(max(need.gib * OOM_GROWTH, need.gib + 1.0), 3), need.resources)


def parameter_count(cfg: dict) -> int:
    """Parameters of a Llama-family checkpoint from its config.json."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or h // heads
    vocab = cfg["vocab_size"]
    attn = h * heads * hd * 2 + h * kv * hd * 2
    per_layer = attn + 3 * h * inter + 2 * h
    emb = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return layers * per_layer + emb + h


def checkpoint_config(checkpoint: str | Path) -> dict:
    """config.json's fields that parameter_count reads; a GGUF file's from its metadata."""
    from argosy.engine.model_names import resolve_model

    path = Path(resolve_model(checkpoint))
    if path.suffix.lower() != ".gguf":
        return json.loads((path / "config.json").read_text())
    from argosy.engine.gguf.file import gguf_model_config

    c = gguf_model_config(path)
    return {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
            "vocab_size": c.vocab_size, "tie_word_embeddings": c.tie_word_embeddings,
            "gguf_bytes": path.stat().st_size}


def runs_on_gpu(engine: EngineSection, gpus_here: bool) -> bool:
    """A replica with this engine section runs on a GPU: its device names CUDA, or is auto where the
    provider's nodes have GPUs."""
    return engine.device.startswith("cuda") or (engine.device == "auto" and gpus_here)


def replica_need(checkpoint: str | Path, engine: EngineSection, on_gpu: bool) -> Need:
    """Memory one replica needs, from the checkpoint's config and the engine settings. A GGUF file's
    quantized weights stay quantized on the CPU (about the file's size) and become bfloat16 on a GPU."""
    cfg = checkpoint_config(checkpoint)
    dtype = engine.dtype
    if dtype == "auto":
        dtype = str(cfg.get("torch_dtype", "bfloat16")) if on_gpu else "float32"
    weights_gib = parameter_count(cfg) * DTYPE_BYTES.get(dtype, 2) / GIB
    if "gguf_bytes" in cfg and not on_gpu and engine.dtype in ("auto", "float32"):
        weights_gib = min(weights_gib, cfg["gguf_bytes"] / GIB)
    n = engine.tensor_parallel_size * engine.pipeline_parallel_size
    if not on_gpu:
        kv = engine.kv_cache_memory_gib if engine.kv_cache_memory_gib is not None else CPU_DEFAULT_KV_GIB
        return Need(0, round(weights_gib + kv + CPU_OVERHEAD_GIB, 3))
    if engine.kv_cache_memory_gib is None:
        return Need(n, float("inf"))  # the engine takes most of each GPU: ask for whole free GPUs
    return Need(n, round(weights_gib / n + engine.kv_cache_memory_gib / n + GPU_OVERHEAD_GIB, 3))


def detect_nodes(configured: list[NodeConfig] | None) -> list[Node]:
    if configured:
        return [Node(n.name, n.provider, [GPU(i, g.model, g.memory_gib) for i, g in enumerate(n.gpus)],
                     n.memory_gib if n.memory_gib is not None else float("inf"), resources=dict(n.resources))
                for n in configured]
    return [Node("local", "local", nvidia_smi_gpus(), available_ram_gib())]


def nvidia_smi_gpus() -> list[GPU]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in out.strip().splitlines():
        idx, name, mib = (x.strip() for x in line.split(","))
        gpus.append(GPU(int(idx), name, float(mib) / 1024))
    return gpus


def available_ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024 ** 2
    except OSError:
        pass
    return float("inf")


class Placer:
    """Tracks what is allocated on each node; `place` one replica, `release` it when it stops.

    With a region's capacity book (fleet/capacity.py) nodes are tried by capacity kind first (reserved,
    then on-demand, then spot, as `capacity_order` says) within each kind's units; cordoned nodes (a
    preemption notice) take nothing new."""

    def __init__(self, nodes: list[Node], capacity: CapacityBook | None = None):
        self.nodes = {n.name: n for n in nodes}
        self.held: dict[str, tuple[str, Placement]] = {}  # replica id -> (model, placement)
        self.capacity = capacity
        self.cordoned: set[str] = set()
        self.oom: dict[str, set[tuple[str, int]]] = {}  # model -> (node, GPU) where it ran out of memory

    def note_oom(self, model: str, p: Placement) -> None:
        """The model ran out of memory on these GPUs: place it elsewhere first from now on."""
        self.oom.setdefault(model, set()).update((p.node, g) for g in p.gpus)

    def _fits(self, node: Node, need: Need, avoid: set[int]) -> tuple[float, tuple[int, ...]] | None:
        """(memory left after placing, GPU indices) for the tightest fit on this node, or None;
        GPUs in `avoid` (holding a copy of the same model) are taken last."""
        if any(node.free_resource(k) < v - 1e-9 for k, v in need.resources):
            return None
        if need.gpus == 0:
            left = node.free_gib - need.gib
            return (left, ()) if left >= -1e-9 else None
        whole = need.gib == float("inf")
        free = sorted((g for g in node.gpus if (g.used_gib == 0 if whole else g.free_gib >= need.gib - 1e-9)),
                      key=lambda g: (g.index in avoid, g.free_gib))
        if len(free) < need.gpus:
            return None
        chosen = free[:need.gpus]  # the tightest GPUs that fit: best fit
        left = sum(g.free_gib for g in chosen) - (0 if need.gib == float("inf") else need.gib * need.gpus)
        return left, tuple(g.index for g in chosen)

    def fit(self, node: Node, model: str, need: Need) -> tuple[tuple, tuple[int, ...]] | None:
        """(preference key, GPU indices) of the best spot for one replica of `model` on `node`, or None.
        Smaller keys are better: spread a model across nodes, then across GPUs (two copies on one GPU
        compete; GPUs where it ran out of memory count the same), then best fit (least left over)."""
        same = any(p.node == node.name for m, p in self.held.values() if m == model)
        same_gpus = {g for m, p in self.held.values() if m == model and p.node == node.name for g in p.gpus}
        same_gpus |= {g for n, g in self.oom.get(model, set()) if n == node.name}
        found = self._fits(node, need, same_gpus)
        if found is None:
            return None
        return (same, any(g in same_gpus for g in found[1]), found[0]), found[1]

    def place(self, replica_id: str, model: str, need: Need, provider: str | None = None,
              down: frozenset[str] | set[str] = frozenset()) -> Placement:
        """Place one replica (nodes in `down` are skipped); raises Unplaceable with the reason."""
        book = self.capacity
        # Units in use by kind: every stage of a replica across nodes counts on its own node.
        used = book.used([(n, p.need.gpus) for _, p in self.held.values() for n, _ in p.parts()]) if book else {}
        best: tuple[tuple, Node, tuple[int, ...]] | None = None
        for node in self.nodes.values():
            if (provider is not None and node.provider != provider) or node.name in down \
                    or node.name in self.cordoned:
                continue
            if book is not None and not book.usable(node.name, need.gpus, used):
                continue
            found = self.fit(node, model, need)
            if found is None:
                continue
            key = (book.rank(node.name) if book else 0, *found[0])  # the capacity kind first (the order)
            if best is None or key < best[0]:
                best = (key, node, found[1])
        if best is None:
            raise Unplaceable(self._why(model, need, provider, down))
        _, node, gpus = best
        p = Placement(node.name, gpus, need)
        self.hold(replica_id, model, p)
        return p

    def place_stages(self, replica_id: str, model: str, need: Need, stages: int, provider: str | None = None,
                     down: frozenset[str] | set[str] = frozenset()) -> Placement:
        """Place a replica whose `stages` pipeline stages each take a node of their own (`need` is the whole
        replica's: its GPUs are split evenly over the stages); raises Unplaceable with the reason."""
        per_stage = Need(need.gpus // stages, need.gib, need.resources)
        parts: list[Placement] = []
        try:
            for i in range(stages):
                used = {p.node for p in parts}
                parts.append(self.place(f"{replica_id}/{i}", model, per_stage, provider, set(down) | used))
        except Unplaceable as e:
            raise Unplaceable(f"{e} (stage {len(parts) + 1} of {stages}, each on a node of its own)") from None
        finally:
            for i in range(len(parts)):
                self.release(f"{replica_id}/{i}")
        p = Placement(parts[0].node, parts[0].gpus, per_stage, tuple((q.node, q.gpus) for q in parts[1:]))
        self.hold(replica_id, model, p)
        return p

    def hold(self, replica_id: str, model: str, p: Placement) -> None:
        """Count a placement made elsewhere (a replica found running, a scheduler's binding)."""
        self._count(p, +1)
        self.held[replica_id] = (model, p)

    def release(self, replica_id: str) -> None:
        held = self.held.pop(replica_id, None)
        if held is not None:
            self._count(held[1], -1)

    def _count(self, p: Placement, sign: int) -> None:
        need = p.need
        for name, gpus in p.parts():
            node = self.nodes[name]
            if need.gpus == 0:
                node.used_gib += sign * need.gib
            for k, v in need.resources:
                node.used_resources[k] = node.used_resources.get(k, 0.0) + sign * v
            for g in node.gpus:
                if g.index in gpus:
                    g.used_gib += sign * (g.memory_gib if need.gib == float("inf") else need.gib)

    def _why(self, model: str, need: Need, provider: str | None, down: frozenset[str] | set[str]) -> str:
        nodes = [n for n in self.nodes.values() if provider is None or n.provider == provider]
        nodes = [n for n in nodes if n.name not in down and n.name not in self.cordoned]
        if not nodes:
            return f"{model}: no live node for provider {provider!r}"
        if self.capacity is not None:
            used = self.capacity.used([(p.node, p.need.gpus) for _, p in self.held.values()])
            open_ = [n for n in nodes if self.capacity.usable(n.name, need.gpus, used)]
            if not open_:
                return f"{model}: every capacity kind of region {self.capacity.region} is in use or left out of " \
                       f"capacity_order ({', '.join(self.capacity.order)})"
            nodes = open_
        if need.resources:
            want = ", ".join(f"{k}: {v:g}" for k, v in need.resources)
            offer = [n for n in nodes if all(n.resources.get(k, 0.0) >= v - 1e-9 for k, v in need.resources)]
            if not offer:
                return f"{model}: needs resources {{{want}}}; no live node of provider {provider!r} offers them"
            free = [n for n in offer if all(n.free_resource(k) >= v - 1e-9 for k, v in need.resources)]
            if not free:
                return (f"{model}: needs resources {{{want}}}; all in use on the nodes that offer them "
                        f"({', '.join(n.name for n in offer)})")
            nodes = free
        if need.gpus == 0:
            most = max(nodes, key=lambda n: n.free_gib)
            return (f"{model}: needs {need.gib:.2f} GiB of RAM; the most free is {most.free_gib:.2f} GiB "
                    f"on {most.name}")
        biggest = max(nodes, key=lambda n: len(n.gpus))
        if len(biggest.gpus) < need.gpus:
            return (f"{model}: needs {need.gpus} GPUs on one node; the largest node ({biggest.name}) has "
                    f"{len(biggest.gpus)}")
        what = "a whole free GPU" if need.gib == float("inf") else f"{need.gib:.2f} GiB free"
        frees = ", ".join(f"{n.name}: " + "/".join(f"{g.free_gib:.1f}" for g in n.gpus) for n in nodes)
        return f"{model}: needs {need.gpus} GPU(s) with {what} each; free GiB per GPU: {frees}"


def place_all(nodes: list[Node], wanted: list[tuple[str, str, Need]]) -> tuple[dict[str, Placement], dict[str, str]]:
    """Best-fit decreasing for a batch: (replica id, model, need) in; placements and reasons out."""
    placer = Placer(nodes)
    placed, failed = {}, {}
    for rid, model, need in sorted(wanted, key=lambda w: -w[2].size() if w[2].gib != float("inf")
                                   else -1e18 - w[2].gpus):
        try:
            placed[rid] = placer.place(rid, model, need)
        except Unplaceable as e:
            failed[rid] = str(e)
    return placed, failed
