"""What routing knows of a request, and the names of what a scorer may need."""

from __future__ import annotations

from dataclasses import dataclass, field

# What a scorer declares it reads (Scorer.needs). The gateway only does the work a router's scorers
# need: it scrapes replicas' /metrics for GAUGES; the simulator only builds prompt text for PROMPT.
GAUGES = "gauges"  # vllm:num_requests_waiting and vllm:kv_cache_usage_perc, scraped from the replicas
PROMPT = "prompt"  # the prompt text (and its prefix hashes)
SESSION = "session"  # the session key (a header or the request's `user`)


@dataclass
class RouteRequest:
    prompt_text: str
    prompt_tokens: int  # estimate
    session_key: str | None = None
    hashes: list[bytes] | None = field(default=None, repr=False)  # prefix hashes, computed once per request
    residency: str | None = None  # the jurisdiction it may be served in (routing between regions)
