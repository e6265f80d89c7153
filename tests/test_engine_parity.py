"""Greedy output and logits against transformers, on random-weight checkpoints of each architecture."""

import pytest
import torch

from argosy import LLM, SamplingParams
from argosy.engine.random_model import make_random_model

transformers = pytest.importorskip("transformers")

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]
NEW_TOKENS = 32


def prompts_for(vocab: int, n: int = 4, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 17, 33, 48, 9, 64][:n]
    return [torch.randint(3, vocab, (k,), generator=g).tolist() for k in lengths]


def hf_greedy(model, prompt: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def greedy(n: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, min_tokens=n)


@pytest.fixture(scope="module", params=ARCHS)
def checkpoint(request, tmp_path_factory):
    kwargs = {"tie_word_embeddings": request.param == "qwen3"}
    path = make_random_model(tmp_path_factory.mktemp(request.param), arch=request.param, init_std=0.2, **kwargs)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return str(path), hf


def test_greedy_matches_transformers_batched_and_alone(checkpoint):
    path, hf = checkpoint
    prompts = prompts_for(hf.config.vocab_size)
    expected = [hf_greedy(hf, p) for p in prompts]
    llm = LLM(path, kv_cache_memory_gib=0.05)
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(), use_tqdm=False)]
    assert batched == expected
    alone = [llm.generate(p, greedy(), use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    assert alone == expected
    llm.engine.kv.check_integrity()
    assert llm.engine.kv.num_free_blocks == llm.engine.runner.num_blocks


def test_logits_match_transformers(checkpoint):
    path, hf = checkpoint
    llm = LLM(path, kv_cache_memory_gib=0.05)
    runner = llm.engine.runner
    captured = []
    original = runner.execute

    def spy(batch):
        logits = original(batch)
        captured.append(logits.clone())
        return logits

    runner.execute = spy
    prompt = prompts_for(hf.config.vocab_size, n=3)[2]
    out = llm.generate(prompt, greedy(8), use_tqdm=False)[0].outputs[0].token_ids
    full = torch.tensor([prompt + out])
    with torch.no_grad():
        ref = hf(full).logits[0]
    # Step k samples from the logits at position len(prompt) - 1 + k.
    ours = torch.cat(captured)
    assert ours.shape[0] == 8
    torch.testing.assert_close(ours, ref[len(prompt) - 1: len(prompt) + 7], atol=1e-4, rtol=0)


def test_llama3_rope_scaling_matches(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256}
    path = make_random_model(tmp_path, arch="llama", init_std=0.2, rope_scaling=scaling)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = prompts_for(hf.config.vocab_size, n=2, seed=1)
    llm = LLM(str(path), kv_cache_memory_gib=0.05)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(), use_tqdm=False)]
    assert got == [hf_greedy(hf, p) for p in prompts]


def test_chunked_prefill_prefix_hits_and_preemption_do_not_change_output(tiny_llama):
    vocab = LLM(tiny_llama, kv_cache_memory_gib=0.01).engine.vocab_size
    shared = sum(prompts_for(vocab, n=4, seed=3), [])  # 103 tokens: six full blocks to share
    prompts = [shared + p for p in prompts_for(vocab, n=6, seed=4)]
    reference = [o.outputs[0].token_ids for o in
                 LLM(tiny_llama, kv_cache_memory_gib=0.05, max_num_seqs=1).generate(prompts, greedy(), use_tqdm=False)]

    chunked = LLM(tiny_llama, kv_cache_memory_gib=0.05, max_num_batched_tokens=16)
    assert [o.outputs[0].token_ids for o in chunked.generate(prompts, greedy(), use_tqdm=False)] == reference

    cached = LLM(tiny_llama, kv_cache_memory_gib=0.05)
    cached.generate(prompts[:1], greedy(), use_tqdm=False)
    hits_before = cached.engine.kv.hits
    assert [o.outputs[0].token_ids for o in cached.generate(prompts, greedy(), use_tqdm=False)] == reference
    assert cached.engine.kv.hits - hits_before >= 6 * 16 * len(prompts)

    # 16 blocks of 16 tokens cannot hold six ~170-token sequences at once: preemption must happen.
    block_bytes = cached.engine.runner.kv_bytes_per_block()
    tight = LLM(tiny_llama, kv_cache_memory_gib=16 * block_bytes / 2**30)
    assert [o.outputs[0].token_ids for o in tight.generate(prompts, greedy(), use_tqdm=False)] == reference
    assert tight.engine.scheduler.num_preemptions > 0
    tight.engine.kv.check_integrity()
    assert tight.engine.kv.num_free_blocks == tight.engine.runner.num_blocks
