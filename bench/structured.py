"""Decode throughput of a batch under a JSON schema against the same batch unconstrained, in one run.

    nice .venv/bin/python bench/structured.py [--model DIR] [--batch 64] [--max-tokens 128] [--rounds 3]

Both batches decode the same number of tokens: the free one ignores EOS, and the schema (an array of at
least 50 objects of enums, bounded integers, bounded strings and booleans) cannot be complete before
--max-tokens, so every constrained sequence runs to the end too, through structure, strings and numbers.
Rounds alternate (free, constrained, free, ...) after a warm-up of each that also compiles the grammar.
Target: constrained >= 90% of unconstrained. The default model is the built-in one (a real 4096-token
vocabulary); pass a larger checkpoint for a larger vocabulary's masks.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import Timer, progress  # noqa: E402

from argosy import LLM, SamplingParams  # noqa: E402
from argosy.engine.structured import StructuredOutputsParams  # noqa: E402
from argosy.models.builtin import BUILTIN_MODEL_DIR  # noqa: E402

ITEM = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 999},
    "name": {"type": "string", "maxLength": 12},
    "kind": {"enum": ["book", "letter", "ball", "visit"]},
    "done": {"type": "boolean"}},
    "required": ["id", "name", "kind", "done"], "additionalProperties": False}
SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": ITEM, "minItems": 50}},
          "required": ["items"], "additionalProperties": False}
PROMPTS = ["It was a fine morning, and", "Mr. Darcy said that", "The letter arrived before", "She walked to"]


class GrammarClock:
    """Time spent filling, applying and advancing the grammars: the constrained run's own overhead, a figure
    the machine's noise moves much less than the two throughputs'."""

    def __init__(self) -> None:
        from argosy.engine.structured.matcher import GrammarBitmask

        self.seconds = 0.0
        for name in ("penalty", "accept"):
            original = inspect.getattr_static(GrammarBitmask, name)
            if isinstance(original, staticmethod):
                setattr(GrammarBitmask, name, staticmethod(self._timed(original.__func__)))
            else:
                setattr(GrammarBitmask, name, self._timed(original))

    def _timed(self, fn):
        def wrapper(*a, **kw):
            with Timer() as t:
                result = fn(*a, **kw)
            self.seconds += t.seconds
            return result
        return wrapper


def run(llm: LLM, batch: int, max_tokens: int, constrained: bool) -> tuple[float, int]:
    structured = StructuredOutputsParams(json=SCHEMA) if constrained else None
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens, ignore_eos=not constrained,
                             structured_outputs=structured) for i in range(batch)]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
    with Timer() as t:
        outs = llm.generate(prompts, params, use_tqdm=False)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return tokens / t.seconds, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(BUILTIN_MODEL_DIR))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    llm = LLM(args.model, kv_cache_memory_gib=0.5)
    clock = GrammarClock()
    for constrained in (False, True):  # warm-up; the schema is compiled here (then cached)
        run(llm, 4, 8, constrained)
    free, constrained, shares = [], [], []
    for r in range(args.rounds):
        for target, runs in ((False, free), (True, constrained)):
            before = clock.seconds
            with Timer() as t:
                tps, tokens = run(llm, args.batch, args.max_tokens, target)
            if target:
                shares.append((clock.seconds - before) / t.seconds)
            assert tokens == args.batch * args.max_tokens, f"{tokens} tokens: a sequence ended early"
            runs.append(tps)
            progress(f"round {r + 1}/{args.rounds}: {'constrained' if target else 'free'} {tps:.0f} tok/s   ")
    sys.stderr.write("\n")
    f, c = statistics.median(free), statistics.median(constrained)
    print(f"model {args.model}: batch {args.batch}, {args.max_tokens} tokens each, {args.rounds} alternating rounds")
    print(f"unconstrained: {f:.0f} tok/s (runs: {', '.join(f'{x:.0f}' for x in free)})")
    print(f"JSON schema:   {c:.0f} tok/s (runs: {', '.join(f'{x:.0f}' for x in constrained)})")
    print(f"ratio constrained/unconstrained: {c / f:.3f} (target >= 0.90)")
    print(f"grammar work (bitmask fill + mask + advance) in the constrained runs: "
          f"{100 * statistics.median(shares):.1f}% of their time")
    llm.close()


if __name__ == "__main__":
    main()
