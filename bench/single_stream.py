"""One request, 128 new tokens, on a ~125M-parameter random Llama: Argosy against llama.cpp (and transformers).

    .venv/bin/python bench/single_stream.py [--llamacpp-python PEER_VENV/bin/python]

Argosy runs twice: as it starts by default, and with `compile_matvec` (`--compile-matvec` on the CLI:
one-token steps through a compiled matrix-vector product; the compile at start is not timed). Each
side's figure is its best of three runs of 128 tokens.

llama.cpp runs through llama-cpp-python on the same weights converted to GGUF in f32. Install the peer
in its own venv (it compiles: ~16 minutes on 2 cores):
    python3.11 -m venv PEER && CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" PEER/bin/pip install llama-cpp-python
The HF-to-GGUF converter ships in llama-cpp-python's source package, which this script fetches from
PyPI (`pip download --no-binary`) unless --llamacpp-src points at an unpacked copy. The converter
needs a tokenizer it knows, so the GGUF gets a small sentencepiece vocabulary; prompts are token ids,
so the tokenizer plays no part in what is measured. Without the peer, the script says so and skips it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import Timer, checkpoint, param_count  # noqa: E402
from llamacpp import add_arguments, converter, peer_version, to_gguf  # noqa: E402

from argosy import LLM, SamplingParams  # noqa: E402

NEW_TOKENS = 128
REPEATS = 3  # each side's best of three: this shared machine's memory bandwidth drifts from second to second
PEER_SCRIPT = r"""
import json, sys, time
from llama_cpp import Llama
model, tokens, n, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=model, n_threads=threads, n_ctx=2048, verbose=False)
def run(k):
    out = []
    start = time.perf_counter()
    for tok in llm.generate(tokens, top_k=1, temp=0.0, reset=True):
        out.append(tok)
        if len(out) == k:
            break
    return out, time.perf_counter() - start
run(8)
runs = [run(n) for _ in range(REPEATS)]
print(json.dumps({"tokens": runs[0][0], "seconds": min(t for _, t in runs)}))
"""


def argosy_run(path: str, prompt: list[int], compile_matvec: bool = False) -> tuple[float, list[int]]:
    llm = LLM(path, kv_cache_memory_gib=0.5, compile_matvec=compile_matvec)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    best = float("inf")
    for _ in range(REPEATS):
        with Timer() as t:
            out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
        best = min(best, t.seconds)
    return NEW_TOKENS / best, out


def transformers_run(path: str, prompt: list[int]) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
        with Timer() as t:
            model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    return NEW_TOKENS / t.seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    ap.add_argument("--skip-transformers", action="store_true")
    args = ap.parse_args()
    path = checkpoint("125m")
    threads = torch.get_num_threads()
    prompt = list(range(10, 42))
    print(f"checkpoint: {path} ({param_count(path) / 1e6:.1f}M parameters, float32), prompt 32 tokens, "
          f"{NEW_TOKENS} new tokens, greedy, {threads} threads")
    a_tps, a_tokens = argosy_run(path, prompt)
    print(f"argosy:       {a_tps:6.1f} tok/s")
    c_tps, c_tokens = argosy_run(path, prompt, compile_matvec=True)
    same = "the same" if c_tokens == a_tokens else "DIFFERENT"
    print(f"argosy, compile_matvec: {c_tps:6.1f} tok/s (greedy tokens {same} as without)")
    if not args.skip_transformers:
        print(f"transformers: {transformers_run(path, prompt):6.1f} tok/s")
    version = peer_version(args.llamacpp_python)
    if version is None:
        print(f"llama.cpp: skipped: llama_cpp is not importable from {args.llamacpp_python}. Install it in its own "
              "venv (see this script's docstring) and pass --llamacpp-python PEER/bin/python.")
        return
    gguf = to_gguf(path, converter(args.llamacpp_src, version))
    peer_script = PEER_SCRIPT.replace("REPEATS", str(REPEATS))
    r = subprocess.run([args.llamacpp_python, "-c", peer_script, str(gguf), json.dumps(prompt), str(NEW_TOKENS),
                        str(threads)], capture_output=True, text=True, check=True)
    peer = json.loads(r.stdout.strip().splitlines()[-1])
    l_tps = NEW_TOKENS / peer["seconds"]
    same = next((i for i, (a, b) in enumerate(zip(a_tokens, peer["tokens"], strict=False)) if a != b), NEW_TOKENS)
    print(f"llama.cpp {version}: {l_tps:6.1f} tok/s (greedy tokens identical to argosy's for the first {same})")
    print(f"single-stream ratio argosy / llama.cpp: {a_tps / l_tps:.2f}x; with compile_matvec: {c_tps / l_tps:.2f}x "
          "(target >= 1.0x)")


if __name__ == "__main__":
    main()
