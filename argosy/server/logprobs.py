"""The engine's per-token logprobs in OpenAI's two formats (legacy completions, chat)."""

from __future__ import annotations

import math
from typing import Any

from argosy.engine.outputs import Logprob, PromptLogprobs, SampleLogprobs

_FLOOR = -9999.0  # JSON has no -Infinity; vLLM clamps the same way


def _value(lp: float) -> float:
    return lp if math.isfinite(lp) else _FLOOR


def _token_str(token_id: int, lp: Logprob, tokenizer: Any) -> str:
    if lp.decoded_token is not None:
        return lp.decoded_token
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _ranked(entries: dict[int, Logprob]) -> list[tuple[int, Logprob]]:
    return sorted(entries.items(), key=lambda item: -item[1].logprob)


def completion_logprobs(
    token_ids: list[int], logprobs: SampleLogprobs, start: int, end: int, text_offset: int, tokenizer: Any
) -> tuple[dict[str, list[Any]], int]:
    """Legacy `logprobs` for generated tokens start..end-1, offsets counted from `text_offset`;
    also returns the offset after the last token."""
    tokens: list[str] = []
    token_logprobs: list[float] = []
    top_logprobs: list[dict[str, float]] = []
    offsets: list[int] = []
    for i in range(start, end):
        token_id, entries = token_ids[i], logprobs[i]
        sampled = entries.get(token_id)
        text = _token_str(token_id, sampled, tokenizer) if sampled is not None else tokenizer.decode([token_id])
        tokens.append(text)
        token_logprobs.append(_value(sampled.logprob) if sampled is not None else _FLOOR)
        # OpenAI's top_logprobs hold the top tokens plus the sampled one, keyed by text. Two tokens can
        # share a text (partial UTF-8 both show as U+FFFD): the likelier one keeps the key.
        top: dict[str, float] = {}
        for tid, lp in _ranked(entries):
            top.setdefault(_token_str(tid, lp, tokenizer), _value(lp.logprob))
        top_logprobs.append(top)
        offsets.append(text_offset)
        text_offset += len(text)
    block = {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}
    return block, text_offset


def echo_logprobs(prompt_token_ids: list[int], prompt_logprobs: PromptLogprobs, tokenizer: Any) -> dict[str, list[Any]]:
    """Legacy `logprobs` of an echoed prompt (completions with echo): the first token has none (null), as in
    OpenAI's and vLLM's answers; offsets count from 0, the completion's tokens continue from the last."""
    first = tokenizer.decode(prompt_token_ids[:1], skip_special_tokens=False)
    block, _ = completion_logprobs(prompt_token_ids, prompt_logprobs, 1, len(prompt_token_ids), len(first), tokenizer)
    return {"tokens": [first, *block["tokens"]], "token_logprobs": [None, *block["token_logprobs"]],
            "top_logprobs": [None, *block["top_logprobs"]], "text_offset": [0, *block["text_offset"]]}


def joined(echo: dict[str, list[Any]], completion: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """An echoed prompt's logprobs followed by its completion's (whose offsets already follow the prompt's)."""
    return {key: echo[key] + completion[key] for key in echo}


def vllm_prompt_logprobs(prompt_logprobs: PromptLogprobs) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs` answer field: per prompt token, None or {token id: logprob, rank, decoded_token}."""
    return [None if entries is None else
            {str(tid): {"logprob": _value(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
             for tid, lp in entries.items()} for entries in prompt_logprobs]


def chat_logprobs(
    token_ids: list[int], logprobs: SampleLogprobs, start: int, end: int, top_k: int, tokenizer: Any
) -> list[dict[str, Any]]:
    """Chat `logprobs.content` entries for generated tokens start..end-1, each with its `top_k`."""
    content: list[dict[str, Any]] = []
    for i in range(start, end):
        token_id, entries = token_ids[i], logprobs[i]
        sampled = entries.get(token_id)
        text = _token_str(token_id, sampled, tokenizer) if sampled is not None else tokenizer.decode([token_id])
        top = []
        for tid, lp in _ranked(entries)[:top_k]:
            top_text = _token_str(tid, lp, tokenizer)
            top.append({"token": top_text, "logprob": _value(lp.logprob), "bytes": list(top_text.encode())})
        content.append({
            "token": text,
            "logprob": _value(sampled.logprob) if sampled is not None else _FLOOR,
            "bytes": list(text.encode()),
            "top_logprobs": top,
        })
    return content
