"""Shadow evaluation without keeping text: a user's answer and the candidate's answer to the same request,
reduced to numbers (PairRecord), and the agreement report over them.

Per pair: identical or not; the position of the first differing token (in the candidate's tokens: the
shadow request always asks for logprobs, so its tokens are known; the user's answer is walked against
them); the length ratio (candidate tokens / user tokens); both finish reasons; and for a greedy request
whose caller asked for logprobs, the mean absolute difference of the chosen tokens' logprobs over the
tokens both chose alike (their divergence). An optional judge's score (0..1) joins later.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

LP_FLOOR = -100.0  # logprobs below this (the server's -9999 for -inf) count as this
BUCKETS = ((128, "<128"), (512, "128-511"), (2048, "512-2047"))  # estimated prompt tokens


def bucket(prompt_tokens: int) -> str:
    return next((name for bound, name in BUCKETS if prompt_tokens < bound), ">=2048")


@dataclass
class Output:
    text: str = ""
    tokens: list[str] | None = None  # token strings, when the response carried logprobs
    logprobs: list[float] | None = None
    finish: str | None = None
    n_tokens: int | None = None  # usage.completion_tokens, else the tokens counted


def _add_logprobs(out: Output, lp: Any) -> None:
    if not isinstance(lp, dict):
        return
    if isinstance(lp.get("content"), list):  # chat
        toks = [(c.get("token", ""), c.get("logprob")) for c in lp["content"] if isinstance(c, dict)]
    elif isinstance(lp.get("tokens"), list):  # completions
        toks = list(zip(lp["tokens"], lp.get("token_logprobs") or [None] * len(lp["tokens"]), strict=False))
    else:
        return
    out.tokens = (out.tokens or []) + [str(t) for t, _ in toks]
    out.logprobs = (out.logprobs or []) + [float(x) if isinstance(x, int | float) else LP_FLOOR for _, x in toks]


def _add_choice(out: Output, ch: dict) -> None:
    if ch.get("index", 0) != 0:
        return
    msg = ch.get("message") or ch.get("delta") or {}
    piece = ch.get("text") if "text" in ch else msg.get("content") if isinstance(msg, dict) else None
    out.text += piece or ""
    _add_logprobs(out, ch.get("logprobs"))
    if ch.get("finish_reason"):
        out.finish = ch["finish_reason"]


def parse_output(chunks: list[bytes], stream: bool) -> Output | None:
    """The first choice of a whole response body or of a list of raw SSE chunks; None if unreadable."""
    out = Output()
    try:
        bodies = [b"".join(chunks)] if not stream else [
            ev[6:] for ev in b"".join(chunks).split(b"\n\n") if ev.startswith(b"data: {")]
        for body in bodies:
            obj = json.loads(body)
            for ch in obj.get("choices") or []:
                _add_choice(out, ch)
            usage = obj.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                out.n_tokens = usage["completion_tokens"]
    except (ValueError, TypeError, AttributeError):
        return None
    if out.n_tokens is None and out.tokens is not None:
        out.n_tokens = len(out.tokens)
    return out


@dataclass
class PairRecord:
    t: float  # when compared (monotonic)
    revision: str  # the candidate's
    greedy: bool  # temperature 0 (or top_k 1): identical outputs are expected from identical models
    prompt_bucket: str
    identical: bool
    first_diff: int | None  # index of the first differing token; None when identical (or no tokens are known)
    length_ratio: float | None  # candidate tokens / user tokens
    finish_user: str | None
    finish_candidate: str | None
    logprob_divergence: float | None  # greedy with the user's logprobs: mean |lp_user - lp_candidate|
    judge: float | None = None  # 0..1 from the judge, when one scored it


def first_difference(user: Output, cand: Output) -> int | None:
    if user.text == cand.text:
        return None
    if user.tokens is not None and cand.tokens is not None:
        n = min(len(user.tokens), len(cand.tokens))
        return next((i for i in range(n) if user.tokens[i] != cand.tokens[i]), n)
    if cand.tokens is not None:  # walk the candidate's tokens along the user's text
        pos = 0
        for i, tok in enumerate(cand.tokens):
            if user.text[pos:pos + len(tok)] != tok:
                return i
            pos += len(tok)
        return len(cand.tokens)
    return None  # no tokens on either side: only "different" is known


def compare(user: Output, cand: Output, revision: str, greedy: bool, prompt_tokens: int, now: float) -> PairRecord:
    diff = first_difference(user, cand)
    ratio = None
    if user.n_tokens and cand.n_tokens is not None:
        ratio = round(cand.n_tokens / user.n_tokens, 4)
    div = None
    if greedy and user.logprobs and cand.logprobs:
        n = min(len(user.logprobs), len(cand.logprobs), diff if diff is not None else len(user.logprobs))
        if n:
            div = round(sum(abs(max(a, LP_FLOOR) - max(b, LP_FLOOR))
                            for a, b in zip(user.logprobs[:n], cand.logprobs[:n], strict=True)) / n, 6)
    return PairRecord(now, revision, greedy, bucket(prompt_tokens), user.text == cand.text, diff, ratio, user.finish,
                      cand.finish, div)


def is_greedy(fields: dict) -> bool:
    t, k = fields.get("temperature"), fields.get("top_k")
    return t == 0 or k == 1


class PairStore:
    """The last `maxlen` pairs of each model (numbers only)."""

    def __init__(self, maxlen: int = 5000):
        self.maxlen = maxlen
        self.by_model: dict[str, deque[PairRecord]] = {}

    def add(self, model: str, rec: PairRecord) -> None:
        self.by_model.setdefault(model, deque(maxlen=self.maxlen)).append(rec)

    def agreement(self, model: str, revision: str, t0: float, t1: float) -> tuple[float | None, int]:
        """Share of greedy pairs in [t0, t1) whose outputs were identical, and how many there were."""
        pairs = [p for p in self.by_model.get(model, ()) if p.revision == revision and p.greedy and t0 <= p.t < t1]
        return (sum(p.identical for p in pairs) / len(pairs) if pairs else None), len(pairs)

    def report(self, model: str | None = None) -> dict[str, Any]:
        """Agreement by model and candidate revision, overall and by prompt length."""
        out: dict[str, Any] = {}
        for name, pairs in self.by_model.items():
            if model is not None and name != model:
                continue
            by_rev: dict[str, list[PairRecord]] = {}
            for p in list(pairs):
                by_rev.setdefault(p.revision, []).append(p)
            out[name] = {rev: {**summarise(ps), "by_prompt_tokens": {
                b: summarise([p for p in ps if p.prompt_bucket == b])
                for b in [n for _, n in BUCKETS] + [">=2048"] if any(p.prompt_bucket == b for p in ps)}}
                for rev, ps in by_rev.items()}
        return out

    def recent(self, model: str, n: int = 20) -> list[dict]:
        return [asdict(p) for p in list(self.by_model.get(model, ()))[-n:]]


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def summarise(pairs: list[PairRecord]) -> dict[str, Any]:
    greedy = [p for p in pairs if p.greedy]
    diffs = [p.first_diff for p in pairs if p.first_diff is not None]
    return {"pairs": len(pairs), "greedy_pairs": len(greedy),
            "identical_greedy": _mean([float(p.identical) for p in greedy]),
            "identical_all": _mean([float(p.identical) for p in pairs]),
            "mean_first_diff_token": _mean([float(d) for d in diffs]),
            "mean_length_ratio": _mean([p.length_ratio for p in pairs if p.length_ratio is not None]),
            "same_finish_reason": _mean([float(p.finish_user == p.finish_candidate) for p in pairs]),
            "mean_logprob_divergence": _mean([p.logprob_divergence for p in pairs
                                              if p.logprob_divergence is not None]),
            "judge_mean": _mean([p.judge for p in pairs if p.judge is not None]),
            "judged": sum(1 for p in pairs if p.judge is not None)}
