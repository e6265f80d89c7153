"""What to send: prompt and output lengths drawn from distributions, synthetic prompt text, shared
system prompts, multi-turn sessions, and JSONL traces.

A Job is one session: an optional shared system prompt and one or more turns. Single requests are
one-turn sessions. Everything is drawn from a seeded RNG, so the same seed gives the same workload
(a rate sweep sends the same requests at every rate).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Common English words that most BPE vocabularies (Llama, GPT, Qwen) hold as one token with their
# leading space, so N words make about N prompt tokens; the exact count comes from the server's usage.
WORDS = (
    "the of and to in is was for that on as with by he it at from his an were are which this be or "
    "not but had have one they you all their has been two more she first new can her after who its "
    "also will over into would there time so up out than only other some any when many these most what "
    "then made may such no later about through years three city we part did world over under state "
    "used while people during work since before well between four both school each high year could war "
    "where national called member early same last back found around life name until should being well "
    "public home left house number small series three book great long team water because film end good "
    "five group system family power line game day play music five light own them much very again set "
    "way land even old order best road open form best right second field area general major little make"
).split()
WORDS = tuple(dict.fromkeys(WORDS))  # unique, in order

DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")


@dataclass(frozen=True)
class LengthDist:
    """Token counts: `mean` with a relative `spread` (uniform: +-spread*mean; normal: std spread*mean;
    lognormal: sigma = spread, scaled so the mean stays `mean`). Never below 1."""

    mean: int
    kind: str = "fixed"
    spread: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in DISTRIBUTIONS:
            raise ValueError(f"unknown distribution {self.kind!r}: one of {', '.join(DISTRIBUTIONS)}")
        if self.mean < 1 or self.spread < 0:
            raise ValueError("token counts must be >= 1 and spreads >= 0")

    def sample(self, rng: random.Random) -> int:
        m, s = self.mean, self.spread
        if self.kind == "fixed" or s == 0:
            x = float(m)
        elif self.kind == "uniform":
            x = rng.uniform(m * (1 - s), m * (1 + s))
        elif self.kind == "normal":
            x = rng.gauss(m, m * s)
        else:
            x = rng.lognormvariate(math.log(m) - s * s / 2, s)
        return max(1, round(x))


@dataclass
class Turn:
    text: str  # the user's new message (or the whole prompt of a one-turn completion)
    new_tokens: int  # its approximate token count
    output_tokens: int


@dataclass
class Job:
    index: int
    turns: list[Turn]
    system: str | None = None  # the shared prefix: a system message, or the start of the prompt
    at_s: float | None = None  # a trace's timestamp (None: the arrival process decides)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(WORDS, k=n))


def approx_tokens(text: str) -> int:
    return len(text.split())


class SyntheticWorkload:
    def __init__(self, prompt: LengthDist, output: LengthDist, seed: int = 0, turns: int = 1,
                 shared_prefix_tokens: int = 0, num_prefixes: int = 1):
        if turns < 1 or num_prefixes < 1 or shared_prefix_tokens < 0:
            raise ValueError("turns and num_prefixes must be >= 1, shared_prefix_tokens >= 0")
        self.prompt, self.output, self.turns, self.seed = prompt, output, turns, seed
        prefix_rng = random.Random(f"prefix-{seed}")
        self.prefixes = [words(prefix_rng, shared_prefix_tokens) for _ in range(num_prefixes)] \
            if shared_prefix_tokens else []

    def jobs(self, num_requests: int | None = None) -> Iterator[Job]:
        """Sessions until `num_requests` turns in all (endless when None: a duration ends the run)."""
        rng = random.Random(self.seed)
        sent, index = 0, 0
        while num_requests is None or sent < num_requests:
            n = self.turns if num_requests is None else min(self.turns, num_requests - sent)
            system = rng.choice(self.prefixes) if self.prefixes else None
            turns = []
            for _ in range(n):
                k = self.prompt.sample(rng)
                # A random opening word sequence per turn: requests share no prefix by accident.
                turns.append(Turn(words(rng, k), k, self.output.sample(rng)))
            yield Job(index, turns, system)
            sent += n
            index += 1


def load_trace(path: str | Path, default_output_tokens: int = 64, seed: int = 0) -> list[Job]:
    """JSONL lines {"timestamp": s, "prompt": "..." | "prompt_tokens": n, "output_tokens": m},
    sorted by timestamp and shifted so the first is at 0 s."""
    rng = random.Random(seed)
    rows = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            ts = float(d["timestamp"])
            if "prompt" in d:
                text = str(d["prompt"])
                k = approx_tokens(text)
            else:
                k = int(d["prompt_tokens"])
                text = words(rng, k)
            out = int(d.get("output_tokens", default_output_tokens))
            if not math.isfinite(ts) or out < 1 or ("prompt" not in d and k < 1):
                raise ValueError("a finite timestamp, and prompt_tokens and output_tokens of 1 or more")
        except (ValueError, KeyError, TypeError, OverflowError) as e:
            raise ValueError(f"{path}:{lineno}: bad trace line ({e.__class__.__name__}: {e})") from None
        rows.append((ts, text, k, out))
    if not rows:
        raise ValueError(f"{path}: empty trace")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [Job(i, [Turn(text, k, out)], at_s=ts - t0) for i, (ts, text, k, out) in enumerate(rows)]
