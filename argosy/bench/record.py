"""One request as measured: what was asked, when it was sent, when each token-carrying chunk came.

Times are seconds. `scheduled_s`, `sent_s` and `finished_s` count from the run's start; `ttft_s`,
`e2e_s` and `chunk_times_s` count from `sent_s`. Neither the prompt nor the output text is kept.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(slots=True)
class RequestRecord:
    index: int
    sent_s: float
    scheduled_s: float | None = None  # None in closed loop: a request goes when a worker is free
    session: int | None = None
    turn: int = 0
    prompt_tokens_target: int = 0
    output_tokens_target: int = 0
    ok: bool = False
    error_kind: str | None = None  # http_<status>, timeout, connection, stream_error, no_tokens
    error: str | None = None  # short, never the prompt
    prompt_tokens: int | None = None  # from the server's usage
    output_tokens: int | None = None  # from the server's usage
    ttft_s: float | None = None
    e2e_s: float | None = None  # to the last chunk that carried tokens (vLLM's E2EL)
    finished_s: float | None = None  # when the response (or its failure) ended
    chunk_times_s: list[float] = field(default_factory=list)  # each token-carrying chunk

    @property
    def lag_s(self) -> float | None:
        """How late the request was sent against its schedule (open loop only)."""
        return None if self.scheduled_s is None else self.sent_s - self.scheduled_s

    @property
    def num_output_tokens(self) -> int:
        """The server's count when it reported usage, else the token-carrying chunks seen."""
        return self.output_tokens if self.output_tokens is not None else len(self.chunk_times_s)

    @property
    def num_prompt_tokens(self) -> int:
        return self.prompt_tokens if self.prompt_tokens is not None else self.prompt_tokens_target

    @property
    def itls_s(self) -> list[float]:
        t = self.chunk_times_s
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def tpot_s(self) -> float | None:
        """(E2EL - TTFT) / (output tokens - 1): excludes the first token; None below 2 tokens."""
        n = self.num_output_tokens
        if not self.ok or self.ttft_s is None or self.e2e_s is None or n < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (n - 1)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():  # microseconds are plenty and keep the file small
            if isinstance(v, float):
                d[k] = round(v, 6)
        d["chunk_times_s"] = [round(t, 6) for t in self.chunk_times_s]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
