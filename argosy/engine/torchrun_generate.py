"""Offline generation on a parallel engine, as an entry point for torchrun (any backend works):

    torchrun --nproc-per-node=2 -m argosy.engine.torchrun_generate --model PATH --tensor-parallel-size 2 \\
        --prompts prompts.jsonl [--max-tokens 64] [--temperature 0] > outputs.jsonl

Every rank runs this module; rank 0 is the driver (it runs the engine and writes one JSON line per
prompt to stdout, in order), the other ranks serve its steps and exit when it is done. prompts.jsonl:
one object per line, {"prompt": "text"} or {"prompt_token_ids": [1, 2, 3]}.
"""

from __future__ import annotations

import argparse
import json
import sys

from argosy.engine.config_flags import add_engine_flags, engine_config_from_args
from argosy.engine.errors import InvalidRequestError
from argosy.engine.sampling_params import SamplingParams


def read_prompts(path: str) -> list[str | list[int]]:
    prompts = []
    with open(path) as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                prompts.append(obj["prompt_token_ids"] if "prompt_token_ids" in obj else obj["prompt"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f"{path} line {n}: expected {{\"prompt\": ...}} or "
                                 "{\"prompt_token_ids\": [...]}") from None
    return prompts


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="argosy.engine.torchrun_generate", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint folder")
    p.add_argument("--prompts", required=True, help="JSON lines: {\"prompt\": ...} or {\"prompt_token_ids\": [...]}")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate per prompt")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    add_engine_flags(p.add_argument_group("engine settings (the fields of EngineConfig)"))
    args = p.parse_args(argv)
    try:
        config = engine_config_from_args(args, model=args.model, usage="offline")
        params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos)
        prompts = read_prompts(args.prompts)
    except (ValueError, OSError) as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    from argosy.engine.parallel.launch import run_if_worker_rank

    if run_if_worker_rank(config):  # torchrun, rank > 0: served the driver's steps until it stopped
        return
    from argosy.engine.llm import LLM

    try:
        with LLM.from_config(config) as llm:
            outputs = llm.generate(prompts, params)
    except (InvalidRequestError, ValueError, OSError) as e:  # a bad checkpoint or prompt: one line, exit 2
        p.exit(2, f"{p.prog}: error: {e}\n")
    for i, out in enumerate(outputs):
        c = out.outputs[0]
        sys.stdout.write(json.dumps({"index": i, "text": c.text, "token_ids": c.token_ids,
                                     "finish_reason": c.finish_reason}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":  # a spawned rank (mp backend) imports this module: keep the work under the guard
    main()
