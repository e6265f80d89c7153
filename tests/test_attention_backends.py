"""Attention backends: a new one is registered without touching the others, the runner picks by
device and dtype, and every block size the settings allow gives the same tokens on each built-in one."""

import pytest
import torch

from argosy import LLM, SamplingParams
from argosy.engine.attention import registry, select_backend
from argosy.engine.attention.sdpa import SdpaBackend
from tests.test_cpu_kernels import assert_same_outputs

PARAMS = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=1)
PROMPTS = [list(range(3, 3 + n)) for n in (4, 19, 40, 70)]


class CountingBackend(SdpaBackend):
    """What a new kernel's module does: one class, one register_backend call."""

    calls = {"decode_groups": 0, "write_kv": 0, "forward": 0}

    @classmethod
    def supports(cls, device, dtype):
        return device.type == "cpu" and dtype == torch.float32

    def decode_groups(self, tables, lens):
        CountingBackend.calls["decode_groups"] += 1
        return super().decode_groups(tables, lens)

    def write_kv(self, kv_cache, k, v, slot_mapping):
        CountingBackend.calls["write_kv"] += 1
        super().write_kv(kv_cache, k, v, slot_mapping)

    def forward(self, q, k, v, kv_cache, meta, scale):
        CountingBackend.calls["forward"] += 1
        return super().forward(q, k, v, kv_cache, meta, scale)


def test_a_registered_backend_is_chosen_by_priority_and_used_by_every_layer(tiny_llama, monkeypatch):
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))  # unregistered after the test
    default = LLM(tiny_llama, kv_cache_memory_gib=0.02)
    expected = default.generate(PROMPTS, PARAMS, use_tqdm=False)
    registry.register_backend("counting", CountingBackend, priority=100)
    assert select_backend(torch.device("cpu"), torch.float32) is CountingBackend
    assert select_backend(torch.device("cpu"), torch.bfloat16).name == "sdpa"  # it does not claim bf16
    llm = LLM(tiny_llama, kv_cache_memory_gib=0.02)
    assert llm.engine.runner.attention.name == "counting"
    got = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    layers = llm.engine.runner.model_config.num_layers
    steps = CountingBackend.calls["decode_groups"]
    assert steps >= PARAMS.max_tokens and CountingBackend.calls["forward"] == CountingBackend.calls["write_kv"]
    assert CountingBackend.calls["forward"] == steps * layers  # each layer, each step
    assert_same_outputs(expected, got, 1e-4)


def test_asking_for_a_backend_that_cannot_run_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown attention backend 'flash'; registered: .*sdpa"):
        select_backend(torch.device("cpu"), torch.float32, "flash")
    with pytest.raises(ValueError, match="'cpu_kernel' does not run on cpu in torch.bfloat16"):
        select_backend(torch.device("cpu"), torch.bfloat16, "cpu_kernel")


@pytest.mark.parametrize("backend", ["cpu_kernel", "sdpa"])
def test_the_block_sizes_the_settings_allow_give_the_same_tokens(tiny_llama, backend):
    outputs = {}
    for block_size in (1, 16, 256):
        llm = LLM(tiny_llama, kv_cache_memory_gib=0.05, block_size=block_size, max_num_batched_tokens=32)
        llm.engine.runner.use_attention(backend)
        outputs[block_size] = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        llm.engine.kv.check_integrity()
    assert_same_outputs(outputs[16], outputs[1], 1e-4)
    assert_same_outputs(outputs[16], outputs[256], 1e-4)
