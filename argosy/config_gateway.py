"""The fleet file's `gateway:` (how the gateway listens, checks upstreams, retries and drains), `keys:`
(API keys, stored as hashes, with their limits) and a model's `guardrails:` (the gateway's input and
output checks). docs/gateway.md.

A leaf module (pydantic only): argosy/config.py puts them in the FleetConfig. Every default is written here.
"""

from __future__ import annotations

import datetime
from typing import Literal

from pydantic import Field, field_validator, model_validator

from argosy.config_section import ConfigSection


class TLSConfig(ConfigSection):
    cert: str | None = None
    key: str | None = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> TLSConfig:
        if (self.cert is None) != (self.key is None):
            raise ValueError("tls needs both cert and key (or neither)")
        return self


class GatewayConfig(ConfigSection):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    redis_url: str | None = None  # limits, counters, prefix index and in-flight counts shared by gateways
    tls: TLSConfig = TLSConfig()
    otlp_endpoint: str | None = None
    log_content: bool = False  # prompts and outputs are never logged unless true (or a model's debug)
    health_interval_s: float = Field(2.0, gt=0)  # active health check (and vllm:* scrape) period
    health_timeout_s: float = Field(2.0, gt=0)
    eject_after_failures: int = Field(3, ge=1)  # consecutive failures that open an upstream's breaker
    eject_for_s: float = Field(5.0, gt=0)  # open breaker cooldown before a half-open probe
    max_retries: int = Field(2, ge=0)  # retries on another upstream for a request that failed before its first byte
    retry_budget: float = Field(0.2, ge=0)  # retries allowed per request, averaged (plus a burst of 10)
    connect_timeout_s: float = Field(5.0, gt=0)  # Envoy's cluster connect_timeout default
    # A hung upstream never holds a request forever. Until the response head (and a stream's first chunk):
    # 600 s, LiteLLM's request timeout (vllm-router waits 1800 s); a non-streamed answer's head comes only
    # once the whole completion is done. Between two reads after that: 300 s, Envoy's stream_idle_timeout.
    first_byte_timeout_s: float = Field(600.0, gt=0)
    idle_read_timeout_s: float = Field(300.0, gt=0)
    max_upstream_connections: int = Field(1024, ge=1)  # per upstream: Envoy's max_connections circuit breaker
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1)  # request bodies above: 413 (the engine's cap too)
    request_header_timeout_s: float = Field(30.0, gt=0)  # a request head not complete by then: closed (slow loris)
    key_pepper_file: str | None = None  # HMAC pepper of key hashes (None: ~/.config/argosy/key-pepper)
    auth_failures_per_minute: int = Field(30, ge=1)  # per client address; beyond: 429 (auth.py)
    default_max_tokens: int = Field(256, ge=1)  # token estimate when a request has no max_tokens
    shared_sync_s: float = Field(0.1, gt=0)  # with redis: period of the in-flight count exchange
    prices: str | None = None  # price book for keys' spend and budgets (default: argosy/cost/prices.yaml)
    region: str | None = None  # this gateway's region (a regions[].name; `--region` sets it)
    # On SIGTERM or Ctrl-C: streams in flight get this long to finish before connections are closed (the
    # default fits podman's 10 s stop timeout; Kubernetes gives 30 s unless the pod says otherwise).
    drain_timeout_s: float = Field(8.0, ge=0)
    # Web pages that may read the answers to their requests (CORS; vLLM's --allowed-origins): origins such as
    # https://app.example.com, or "*" for any. None by default: browsers let no other page read an answer.
    cors_allow_origins: list[str] = []

    @field_validator("cors_allow_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        for origin in v:
            scheme, sep, rest = origin.partition("://")
            if origin != "*" and (scheme not in ("http", "https") or not sep or not rest or "/" in rest):
                raise ValueError(f"{origin!r} is not an origin: scheme://host[:port] (no path), or \"*\"")
        return v


class KeyConfig(ConfigSection):
    name: str
    hash: str
    models: list[str] | None = None  # None: every model
    rpm: int | None = Field(None, ge=1)  # None: unlimited
    tpm: int | None = Field(None, ge=1)
    priority: Literal["interactive", "batch"] = "interactive"
    budget_usd: float | None = Field(None, gt=0)  # spend at the price book's rates past which requests get 429
    expires_at: datetime.datetime | None = None  # after this (ISO 8601; UTC when no zone) requests get 401
    residency: str | None = None  # a jurisdiction (regions[].jurisdiction) its requests never leave

    @field_validator("name")
    @classmethod
    def _printable(cls, v: str) -> str:
        # A name goes into logs, metric labels and the admin URL /admin/keys/NAME.
        if not 1 <= len(v) <= 64 or any(c.isspace() or c == "/" or not c.isprintable() for c in v):
            raise ValueError("a key name is 1 to 64 characters, without spaces, slashes or control characters")
        return v

    @field_validator("expires_at")
    @classmethod
    def _utc(cls, v: datetime.datetime | None) -> datetime.datetime | None:
        return v.replace(tzinfo=datetime.UTC) if v is not None and v.tzinfo is None else v


class GuardrailStep(ConfigSection):
    pii: Literal["redact", "block"] | None = None
    blocklist: list[str] | None = None
    regex: list[str] | None = None
    max_prompt_tokens: int | None = Field(None, ge=1)
    moderation_url: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> GuardrailStep:
        set_fields = [k for k, v in self.__dict__.items() if v is not None]
        if len(set_fields) != 1:
            raise ValueError(f"a guardrail step has exactly one of pii, blocklist, regex, "
                             f"max_prompt_tokens, moderation_url (got {set_fields or 'none'})")
        return self


class GuardrailsConfig(ConfigSection):
    input: list[GuardrailStep] = []
    output: list[GuardrailStep] = []
    stream_window_chars: int = Field(64, ge=1)  # output text held back on streams so a split match is caught
