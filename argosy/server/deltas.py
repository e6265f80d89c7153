"""Turns cumulative engine outputs into per-choice stream deltas (what is new since the last chunk)."""

from __future__ import annotations

from dataclasses import dataclass

from argosy.engine.outputs import CompletionOutput, RequestOutput


@dataclass(slots=True)
class Delta:
    index: int  # OpenAI's choice index: prompt_index * n + completion index
    completion: CompletionOutput
    text: str
    token_start: int  # the new tokens are completion.token_ids[token_start:token_end]
    token_end: int
    finish_reason: str | None  # set on a choice's last delta only


class DeltaTracker:
    def __init__(self, request_ids: list[str], n: int, every_token: bool):
        """`every_token`: a chunk for new tokens even without new text (their logprobs must go out)."""
        self._prompt_index = {rid: i for i, rid in enumerate(request_ids)}
        self._n = n
        self._every_token = every_token
        size = len(request_ids) * n
        self._text_sent = [0] * size
        self._tokens_sent = [0] * size
        self._done = [False] * size

    def deltas(self, outputs: list[RequestOutput]) -> list[Delta]:
        found: list[Delta] = []
        for out in outputs:
            base = self._prompt_index[out.request_id] * self._n
            for completion in out.outputs:
                index = base + completion.index
                if self._done[index]:
                    continue
                text, num_tokens = completion.text, len(completion.token_ids)
                text_start, token_start = self._text_sent[index], self._tokens_sent[index]
                finish = completion.finish_reason
                if len(text) == text_start and finish is None and not (self._every_token and num_tokens > token_start):
                    continue
                self._text_sent[index], self._tokens_sent[index] = len(text), num_tokens
                self._done[index] = finish is not None
                found.append(Delta(index, completion, text[text_start:], token_start, num_tokens, finish))
        return found
