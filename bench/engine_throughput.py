"""Engine throughput against transformers' batched `generate`, decode efficiency, and prefix-cache TTFT.

    .venv/bin/python bench/engine_throughput.py [--size small] [--num-requests 256]

Same random-weight checkpoint and the same seeded workload for both. transformers runs the way a
user writes it: padded batches of --hf-batch prompts, each batch generating up to its longest
requested output. Only the requested output tokens count, for both.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import Timer, checkpoint, param_count, progress, workload  # noqa: E402

from argosy import LLM, SamplingParams  # noqa: E402


def run_argosy(path: str, work, kv_gib: float) -> tuple[float, int]:
    llm = LLM(path, kv_cache_memory_gib=kv_gib)
    prompts = [p for p, _ in work]
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for _, o in work]
    llm.generate(prompts[:4], params[:4], use_tqdm=False)  # warm-up
    with Timer() as t:
        outs = llm.generate(prompts, params)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return tokens / t.seconds, tokens


def run_transformers(path: str, work, batch: int) -> tuple[float, int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokens = 0
    with Timer() as t:
        for i in range(0, len(work), batch):
            chunk = work[i:i + batch]
            width = max(len(p) for p, _ in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for j, (p, _) in enumerate(chunk):  # left padding, as decoder-only generation needs
                ids[j, width - len(p):] = torch.tensor(p)
                mask[j, width - len(p):] = 1
            longest = max(o for _, o in chunk)
            with torch.inference_mode():
                model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                               do_sample=False, pad_token_id=0)
            tokens += sum(o for _, o in chunk)
            progress(f"transformers: {min(i + batch, len(work))}/{len(work)} requests, {t_elapsed(t):.0f} s")
    sys.stderr.write("\n")
    return tokens / t.seconds, tokens


def t_elapsed(t: Timer) -> float:
    return time.perf_counter() - t.start


def decode_efficiency(path: str, batch: int, prompt_len: int, steps: int) -> tuple[float, float]:
    """Engine decode tokens/s against the bare model forward (same batch, same context) tokens/s."""
    llm = LLM(path, kv_cache_memory_gib=1.0, max_num_batched_tokens=batch * prompt_len)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=steps + 50, ignore_eos=True)
    g = torch.Generator().manual_seed(1)
    for i in range(batch):
        engine.add_request(str(i), torch.randint(10, engine.vocab_size, (prompt_len,), generator=g).tolist(), params)
    engine.step()  # all prefills in one step
    for _ in range(3):
        engine.step()
    with Timer() as t:
        for _ in range(steps):
            engine.step()
    engine_tps = batch * steps / t.seconds
    # The bare forward: the same decode batch, prepared once, run repeatedly.
    running = list(engine.scheduler.running)
    runner = engine.runner
    inputs = runner.prepare([(s, 1) for s in running])
    with Timer() as t:
        for _ in range(steps):
            runner.execute(inputs)
    bare_tps = batch * steps / t.seconds
    for s in running:
        engine.abort_request(s.request_id)
    return engine_tps, bare_tps


def prefix_ttft(path: str, prefix_len: int = 1024, suffix_len: int = 16) -> tuple[float, float]:
    llm = LLM(path, kv_cache_memory_gib=1.0)
    engine = llm.engine
    g = torch.Generator().manual_seed(2)

    def ttft(prompt: list[int]) -> float:
        start = time.perf_counter()
        engine.add_request(f"p{start}", prompt, SamplingParams(temperature=0, max_tokens=1))
        while engine.has_unfinished_requests():
            engine.step()
        return time.perf_counter() - start

    def fresh() -> list[int]:
        return torch.randint(10, engine.vocab_size, (prefix_len + suffix_len,), generator=g).tolist()

    ttft(fresh())  # warm-up
    misses = [ttft(fresh()) for _ in range(3)]
    prefix = fresh()[:prefix_len]
    ttft(prefix + fresh()[:suffix_len])  # puts the prefix in the cache
    hits = [ttft(prefix + fresh()[:suffix_len]) for _ in range(3)]
    return sorted(misses)[1], sorted(hits)[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="small", choices=["tiny", "small", "125m"])
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--kv-cache-gib", type=float, default=4.0)
    ap.add_argument("--decode-batch", type=int, default=64)
    ap.add_argument("--skip-transformers", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    path = checkpoint(args.size)
    vocab = 900  # prompt ids drawn from the trained tokenizer's ids; the LM head stays 8192 wide
    work = workload(args.num_requests, (32, 512), (32, 256), vocab, seed=0)
    print(f"checkpoint: {path} ({param_count(path) / 1e6:.1f}M parameters, float32), "
          f"{args.num_requests} requests, prompts 32-512 tokens, outputs 32-256 tokens, seed 0, "
          f"{torch.get_num_threads()} threads")
    a_tps, a_tok = run_argosy(path, work, args.kv_cache_gib)
    print(f"argosy LLM.generate:        {a_tps:8.1f} output tok/s ({a_tok} tokens)")
    if not args.skip_transformers:
        h_tps, h_tok = run_transformers(path, work, args.hf_batch)
        print(f"transformers generate (batch {args.hf_batch}): {h_tps:8.1f} output tok/s ({h_tok} tokens)")
        print(f"throughput ratio argosy / transformers: {a_tps / h_tps:.2f}x")
    e_tps, b_tps = decode_efficiency(path, args.decode_batch, 128, 20)
    print(f"decode at batch {args.decode_batch}: engine {e_tps:.1f} tok/s, bare forward {b_tps:.1f} tok/s, "
          f"efficiency {100 * e_tps / b_tps:.1f}%")
    miss, hit = prefix_ttft(path)
    print(f"prefix cache, 1024-token shared prefix + 16-token suffix: TTFT miss {miss * 1e3:.1f} ms, "
          f"hit {hit * 1e3:.1f} ms, {miss / hit:.1f}x faster")


if __name__ == "__main__":
    main()
