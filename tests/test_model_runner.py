"""KV-cache sizing and the batch layout the model runner builds."""

import pytest
import torch

from argosy.engine.config import EngineConfig
from argosy.engine.model_runner import ModelRunner
from argosy.engine.sampling_params import SamplingParams
from argosy.engine.sequence import Sequence


@pytest.fixture(scope="module")
def runner(tiny_llama):
    return ModelRunner(EngineConfig(model=tiny_llama, kv_cache_memory_gib=0.01))


def test_kv_cache_fits_its_budget(runner):
    budget = 0.01 * 2**30
    used = sum(t.numel() * t.element_size() for t in runner.kv_caches)
    assert used <= budget
    assert used + runner.kv_bytes_per_block() > budget  # and wastes less than one block
    assert runner.num_blocks == len(runner.kv_caches[0][0])


def test_a_budget_below_two_blocks_is_a_clear_error(tiny_llama):
    with pytest.raises(ValueError, match="kv_cache_memory_gib"):
        ModelRunner(EngineConfig(model=tiny_llama, kv_cache_memory_gib=1e-7))


def test_decodes_are_grouped_by_length_with_bounded_padding(runner, monkeypatch):
    from argosy.engine.attention import create_backend

    # The grouping is for gather + SDPA (the batch layout asks runner.attention for it).
    monkeypatch.setattr(runner, "attention", create_backend(runner.attention.ctx, "sdpa"))
    bs = runner.block_size
    lengths = [3, 700, 40, 41, 300, 5, 650, 17, 18, 16 * 9]
    seqs, next_block = [], 0
    for n in lengths:
        seq = Sequence("r", list(range(1, n + 1)), SamplingParams())
        blocks = -(-n // bs)
        seq.block_ids = list(range(next_block, next_block + blocks))
        next_block += blocks
        seq.num_computed_tokens = n - 1
        seqs.append(seq)
    batch = runner.prepare([(s, 1) for s in seqs])
    groups = batch.meta.decode_groups
    assert sum(g.count for g in groups) == len(seqs)
    assert [g.start for g in groups] == [sum(g.count for g in groups[:i]) for i in range(len(groups))]
    # Tokens are ordered by context length and every mask marks exactly each sequence's context.
    positions = batch.positions.tolist()
    assert positions == sorted(positions)
    for g in groups:
        if g.mask is None:  # a lone decode: no padding, its K/V cut to its context
            assert g.count == 1 and g.context_len == positions[g.start] + 1
            continue
        real = g.mask.view(g.count, -1).sum(1).tolist()
        assert real == [p + 1 for p in positions[g.start:g.start + g.count]]
        width = g.block_table.shape[1]
        assert g.count * width <= 1.25 * sum(-(-r // bs) for r in real) + width
    assert len(groups) > 1
    # Every sequence samples, and the sampled rows follow the new order.
    assert sorted(s.seq_id for s in batch.sampling_seqs) == sorted(s.seq_id for s in seqs)
    assert torch.equal(batch.sample_indices, torch.arange(len(seqs)))


def test_compile_matvec_routes_one_token_steps_through_the_kernel_with_the_same_outputs(tiny_llama):
    import functools

    from argosy import LLM

    prompts = [list(range(5, 37)), list(range(40, 60))]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1)
    plain, fast = LLM(tiny_llama, kv_cache_memory_gib=0.02), LLM(tiny_llama, kv_cache_memory_gib=0.02,
                                                                    compile_matvec=True)
    linear = fast.engine.runner.model.layers[0].mlp.down_proj
    assert isinstance(linear.forward, functools.partial)  # compiled and routed, not silently left out
    assert linear.weight.is_contiguous()  # the [out, in] layout the kernel streams
    for batch in ([prompts[0]], prompts):  # alone (one-token decode steps), and batched (F.linear)
        a, b = plain.generate(batch, params, use_tqdm=False), fast.generate(batch, params, use_tqdm=False)
        for x, y in zip(a, b, strict=True):
            assert x.outputs[0].token_ids == y.outputs[0].token_ids
            lx = [next(iter(d.values())).logprob for d in x.outputs[0].logprobs]
            ly = [next(iter(d.values())).logprob for d in y.outputs[0].logprobs]
            assert max(abs(p - q) for p, q in zip(lx, ly, strict=True)) < 1e-4
    x = torch.randn(1, linear.in_features)
    torch.testing.assert_close(linear(x), torch.nn.functional.linear(x, linear.weight), rtol=1e-4, atol=1e-5)


def test_decode_groups_stay_within_the_copy_budget_and_outputs_do_not_change(tiny_llama):
    from argosy import LLM

    prompts = [list(range(3, 3 + n)) for n in (20, 33, 47, 50, 64, 70, 90, 130)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    whole = LLM(tiny_llama, kv_cache_memory_gib=0.02)
    whole.engine.runner.use_attention("sdpa").max_group_blocks = 1 << 30  # the groups are for gather + SDPA
    split = LLM(tiny_llama, kv_cache_memory_gib=0.02)
    runner = split.engine.runner
    runner.use_attention("sdpa").max_group_blocks = 12  # a few sequences a group
    seen = []
    prepare = runner.prepare

    def spy(scheduled):
        batch = prepare(scheduled)
        seen.extend(batch.meta.decode_groups)
        return batch

    runner.prepare = spy
    a = whole.generate(prompts, params, use_tqdm=False)
    b = split.generate(prompts, params, use_tqdm=False)
    big = [g for g in seen if g.count > 1]
    assert big and max(g.count for g in seen) < len(prompts)  # the budget did split the decodes
    assert all(g.count * g.block_table.shape[1] <= 12 for g in big)
    for x, y in zip(a, b, strict=True):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        lx = [next(iter(d.values())).logprob for d in x.outputs[0].logprobs]
        ly = [next(iter(d.values())).logprob for d in y.outputs[0].logprobs]
        assert max(abs(p - q) for p, q in zip(lx, ly, strict=True)) < 1e-5


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc's allocator setting")
def test_a_freed_tensor_stays_in_the_heap_for_the_next_step():
    import subprocess
    import sys

    code = """
import ctypes, sys, torch
from argosy.engine.cpu_memory import keep_freed_memory
class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
info = ctypes.CDLL(None).mallinfo2
info.restype = Info
if sys.argv[1] == "keep":
    keep_freed_memory()
t = torch.ones(16 << 20)  # 64 MiB
mapped = info().hblkhd
del t
print(mapped >> 20, info().fordblks >> 20)
"""
    out = {mode: subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,
                                check=True).stdout.split() for mode in ("default", "keep")}
    (mapped_default, free_default), (mapped_keep, free_keep) = ([int(x) for x in out[m]] for m in ("default", "keep"))
    # glibc's default maps a tensor this big on its own and unmaps it when freed: the next step faults
    # its pages in again. Kept, it comes from the heap and returns there.
    assert mapped_default >= 64 and free_default < 64
    assert mapped_keep < 64 and free_keep >= 64


def _transparent_huge_pages() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def test_cpu_weights_sit_in_huge_pages_where_the_kernel_offers_them(tiny_llama):
    import subprocess
    import sys

    code = """
import sys, torch
from argosy.engine.cpu_memory import weights_in_huge_pages
from argosy.engine.checkpoint import load_model_config
from argosy.engine.models.llama import LlamaForCausalLM
def huge_kib():
    with open("/proc/self/smaps_rollup") as f:
        return int(f.read().split("AnonHugePages:")[1].split()[0])
model = LlamaForCausalLM(load_model_config(sys.argv[1]))
model.lm_head.weight = model.embed_tokens.weight  # tied: one weight, moved once
kib = huge_kib()
moved = weights_in_huge_pages(model) if sys.argv[2] == "move" else False
assert model.lm_head.weight is model.embed_tokens.weight
with torch.no_grad():
    for p in model.parameters():  # what loading the checkpoint does
        p.copy_(torch.randn(p.shape))
print(moved, huge_kib() - kib)
"""
    runs = {mode: subprocess.run([sys.executable, "-c", code, tiny_llama, mode], capture_output=True, text=True,
                                 check=True).stdout.split() for mode in ("move", "stay")}
    assert runs["stay"] == ["False", "0"]  # nothing else in the process asks for huge pages
    if _transparent_huge_pages():
        assert runs["move"][0] == "True" and int(runs["move"][1]) >= 2048
    else:  # the kernel has them off: the weights stay where they are
        assert runs["move"] == ["False", "0"]


def test_the_cpu_token_budget_follows_the_use_offline_or_serving(tiny_llama):
    from argosy import LLM

    cpu = torch.device("cpu")
    assert EngineConfig(model=tiny_llama).token_budget(cpu) == 512  # a replica: short steps between tokens
    assert EngineConfig(model=tiny_llama, usage="offline").token_budget(cpu) == 2048
    assert EngineConfig(model=tiny_llama, usage="offline", max_num_batched_tokens=64).token_budget(cpu) == 64
    assert LLM(tiny_llama, kv_cache_memory_gib=0.01).engine.scheduler.token_budget == 2048
    with pytest.raises(ValueError, match="usage"):
        EngineConfig(model=tiny_llama, usage="batch")
