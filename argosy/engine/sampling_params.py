"""Per-request sampling settings, shaped like vLLM's `SamplingParams` so vLLM code ports unchanged."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from argosy.engine.errors import InvalidRequestError
from argosy.engine.structured.params import StructuredOutputsParams

if TYPE_CHECKING:
    import torch


class SamplingParamsError(InvalidRequestError):
    """A sampling setting is out of range; `param` names the offending field."""


def _clamped_logit_bias(bias: object) -> dict[int, float]:
    """logit_bias with each value clamped to [-100, 100], as vLLM does; SamplingParamsError for a key that is
    no token id or a value that is no number."""
    if not isinstance(bias, dict):
        raise SamplingParamsError("logit_bias must map token ids to numbers.", "logit_bias")
    clamped = {}
    for token, value in bias.items():
        if not isinstance(token, int) or isinstance(token, bool) or token < 0:
            raise SamplingParamsError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}.",
                                      "logit_bias")
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise SamplingParamsError(f"logit_bias[{token}] must be a number, got {value!r}.", "logit_bias")
        clamped[token] = min(100.0, max(-100.0, float(value)))
    return clamped


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: all tokens
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    max_tokens: int | None = 16  # None: up to the model's context length
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None  # top-k logprobs per generated token, beside the sampled one
    prompt_logprobs: int | None = None  # top-k logprobs per prompt token, beside the prompt's own (vLLM's)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Added to the named tokens' logits before anything else (OpenAI's logit_bias): -100 bans a token, 100 all
    # but forces it. Values are clamped to [-100, 100], as vLLM does; the engine checks the ids against its vocab.
    logit_bias: dict[int, float] | None = None
    # A grammar the output must follow (JSON schema, regex, choice, EBNF): vLLM's structured_outputs.
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        self.validate()
        if self.logit_bias is not None:  # checked and clamped in one pass: a request may bias the whole vocabulary
            self.logit_bias = _clamped_logit_bias(self.logit_bias) or None

    @functools.cached_property
    def logit_bias_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """logit_bias as (token ids, biases) CPU tensors, made once: a request may bias the whole vocabulary,
        and each of its rows is biased at every step."""
        import torch  # here: `argosy` imports this module, and the gateway runs without torch

        bias = self.logit_bias or {}
        return torch.tensor(list(bias), dtype=torch.long), torch.tensor(list(bias.values()), dtype=torch.float32)

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def validate(self) -> None:
        def fail(param: str, message: str) -> None:
            raise SamplingParamsError(message, param)

        if not isinstance(self.n, int) or self.n < 1:
            fail("n", f"n must be at least 1, got {self.n}.")
        if not 0 <= self.temperature < math.inf:  # NaN too: the offline API takes any float
            fail("temperature", f"temperature must be non-negative and finite, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            fail("top_p", f"top_p must be in (0, 1], got {self.top_p}.")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            fail("top_k", f"top_k must be -1 (disable) or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            fail("min_p", f"min_p must be in [0, 1], got {self.min_p}.")
        if not -2.0 <= self.presence_penalty <= 2.0:
            fail("presence_penalty", f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            fail("frequency_penalty", f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not 0.0 < self.repetition_penalty < math.inf:
            fail("repetition_penalty", f"repetition_penalty must be greater than 0 and finite, "
                                       f"got {self.repetition_penalty}.")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            fail("max_tokens", f"max_tokens must be at least 1, got {self.max_tokens}.")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            fail("min_tokens", f"min_tokens must be non-negative, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            fail("min_tokens", f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens}).")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            fail("logprobs", f"logprobs must be between 0 and 20, got {self.logprobs}.")
        if self.prompt_logprobs is not None and (not isinstance(self.prompt_logprobs, int)
                                                 or isinstance(self.prompt_logprobs, bool)
                                                 or not 0 <= self.prompt_logprobs <= 20):
            fail("prompt_logprobs", f"prompt_logprobs must be between 0 and 20, got {self.prompt_logprobs}.")
        if any(not isinstance(s, str) or not s for s in self.stop):
            fail("stop", "stop must hold non-empty strings.")
        if self.seed is not None and (not isinstance(self.seed, int) or not -(2**63) <= self.seed < 2**64):
            fail("seed", "seed must be an integer that fits in 64 bits.")  # torch's generators take no more
