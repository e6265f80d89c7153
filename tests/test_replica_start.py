"""What a replica's start costs: `argosy engine` imports only its own command, building a model skeleton on
the meta device does not pull in torch's compiler stack, and the CPU's KV cache is not written at start
(2.4 s to 1.0 s, the built-in model and the default 2 GiB cache on the 2-core test host)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from argosy.cli import COMMANDS
from tests.server_fixtures import ROOT


def run_python(code: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_command_imports_only_its_own_module():
    code = """
import json, sys
from argosy.cli import COMMANDS, main
try:
    main([sys.argv[1], "--help"])
except SystemExit as e:
    code = e.code
print(json.dumps({"exit": code, "loaded": [m for _, _, m, _, _ in COMMANDS if m in sys.modules]}))
"""
    for name, module in (("engine", "argosy.server.cli"), ("cost", "argosy.cost.cli")):
        seen = run_python(code, name)
        assert seen == {"exit": 0, "loaded": [module]}, (name, seen)


@pytest.mark.parametrize("name", [c[0] for c in COMMANDS] + ["generate", "make-test-model", "install-smollm2"])
def test_every_command_still_has_its_flags(name, capsys):
    from argosy.cli import main

    with pytest.raises(SystemExit) as stop:
        main([name, "--help"])
    assert stop.value.code == 0
    shown = capsys.readouterr().out
    usage = shown.split("\n\n", 1)[0]
    assert usage.startswith(f"usage: argosy {name} ") and usage.split() != ["usage:", "argosy", name, "[-h]"]


def test_a_model_loads_and_steps_without_torch_compiler_modules(tiny_llama, tmp_path):
    """Ops on meta tensors go through torch's Python references, which import torch._dynamo (0.5-0.9 s here)
    and sympy (0.3 s): the skeleton's embeddings are left unfilled, its rotary frequencies computed on the
    CPU, and its memory given without torch.empty_like."""
    from argosy.encoder.random_model import make_random_bert

    bert = make_random_bert(tmp_path / "bert", kind="embed", size="tiny", seed=0)
    code = """
import json, sys
from argosy.engine.config import EngineConfig
from argosy.engine.llm_engine import LLMEngine
from argosy.engine.sampling_params import SamplingParams
from argosy.encoder.config import EncoderConfig
from argosy.encoder.engine import EncoderEngine
heavy = ("torch._dynamo", "sympy")
before = [m for m in heavy if m in sys.modules]
engine = LLMEngine(EngineConfig(model=sys.argv[1], kv_cache_memory_gib=0.01))
engine.add_request("0", "hello", SamplingParams(max_tokens=4))
while engine.has_unfinished_requests():
    engine.step()
EncoderEngine(EncoderConfig(model=sys.argv[2]))
print(json.dumps({"before": before, "after": [m for m in heavy if m in sys.modules]}))
"""
    assert run_python(code, str(tiny_llama), str(bert)) == {"before": [], "after": []}


def test_rope_frequencies_are_the_same_from_a_meta_build(tiny_llama):
    import torch

    from argosy.engine.checkpoint import load_model_config
    from argosy.engine.models.llama import LlamaForCausalLM, rope_inv_freq

    cfg = load_model_config(tiny_llama)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
        inside = rope_inv_freq(cfg)
    assert inside.device.type == "cpu" and model.embed_tokens.weight.device.type == "meta"
    dim = cfg.head_dim
    assert torch.equal(inside, 1.0 / cfg.rope_theta ** (torch.arange(0, dim, 2).float() / dim))


def test_the_cpu_kv_cache_is_zeros_that_take_memory_as_written(tiny_llama):
    code = """
import json, sys
from argosy.engine.cpu_memory import zeroed_on_first_touch
from argosy.engine.config import EngineConfig
from argosy.engine.llm_engine import LLMEngine
from argosy.engine.sampling_params import SamplingParams
import torch
def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
engine = LLMEngine(EngineConfig(model=sys.argv[1], kv_cache_memory_gib=1.0))
runner = engine.runner
cache_mib = sum(t.numel() * t.element_size() for t in runner.kv_caches) / 2**20
at_start = resident_mib()
engine.add_request("0", "hello", SamplingParams(max_tokens=4))
while engine.has_unfinished_requests():
    engine.step()
before = resident_mib()
part = zeroed_on_first_touch((64, 2**20), torch.float32)  # 256 MiB
fresh = resident_mib() - before
part[:8] = 1.0  # 32 MiB written
written = resident_mib() - before
print(json.dumps({"cache_mib": cache_mib, "at_start_mib": at_start, "zeros": bool((part[8:] == 0).all()),
                  "ones": bool((part[:8] == 1).all()), "fresh_mib": fresh, "written_mib": written}))
"""
    seen = run_python(code, str(tiny_llama))
    assert seen["cache_mib"] > 900 and seen["at_start_mib"] < 700, seen  # torch.zeros held all of it
    assert seen["zeros"] and seen["ones"], seen
    assert seen["fresh_mib"] < 8 and 28 < seen["written_mib"] < 48, seen


def test_materialize_gives_what_to_empty_then_to_gives():
    import torch
    from torch import nn

    from argosy.engine.models.skeleton import materialize

    def skeleton() -> nn.Module:
        with torch.device("meta"):
            m = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
            m.register_buffer("steps", torch.zeros(2, dtype=torch.int64))
        return m

    ours = materialize(skeleton(), torch.device("cpu"), torch.bfloat16)
    theirs = skeleton().to_empty(device="cpu").to(torch.bfloat16)
    shape = {n: (t.shape, t.dtype, t.device) for n, t in ours.state_dict().items()}
    assert shape == {n: (t.shape, t.dtype, t.device) for n, t in theirs.state_dict().items()}
    assert shape["steps"][1] == torch.int64 and shape["0.weight"][1] == torch.bfloat16
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in ours.parameters())


def test_argosy_serve_runs_its_gateway_and_controller_without_torch(tiny_llama, tmp_path):
    """The serve process reads checkpoint configs (a folder's, a GGUF file's, an encoder's) and routes; it
    never imports torch (265 MB resident and 290,000 objects for its collector, before; 73 MB after)."""
    import httpx

    from argosy.encoder.random_model import make_random_bert
    from tests.fleet_fixtures import Serve, ready, tiny_fleet
    from tests.gguf_fixtures import hf_to_gguf

    gguf_file = hf_to_gguf(tiny_llama, tmp_path / "tiny.gguf", "Q8_0")
    bert = make_random_bert(tmp_path / "bert", kind="embed", size="tiny", seed=0)
    fleet = tiny_fleet(str(tiny_llama), min_replicas=1, max_replicas=1)
    base = fleet["models"][0]
    fleet["models"] += [{**base, "name": "tiny-gguf", "checkpoint": str(gguf_file)},
                        {"name": "bert", "kind": "embed", "checkpoint": str(bert), "autoscaling": base["autoscaling"]}]
    serve = Serve(fleet)
    try:
        for name in ("tiny", "tiny-gguf", "bert"):
            t0 = time.monotonic()
            while not [r for m in httpx.get(serve.url + "/admin/fleet", timeout=10).json()["models"]
                       if m["model"] == name for r in ready(m)]:
                assert time.monotonic() - t0 < 120, "\n".join(serve.lines[-20:])
                time.sleep(0.2)
        for name in ("tiny", "tiny-gguf"):
            r = httpx.post(serve.url + "/v1/completions", timeout=60,
                           json={"model": name, "prompt": "hello", "max_tokens": 3})
            assert r.status_code == 200, r.text
        r = httpx.post(serve.url + "/v1/embeddings", json={"model": "bert", "input": "hello"}, timeout=60)
        assert r.status_code == 200, r.text
        with open(f"/proc/{serve.proc.pid}/maps") as f:
            assert "libtorch" not in f.read()
    finally:
        serve.stop()
