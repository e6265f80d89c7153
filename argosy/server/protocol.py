"""Typed reads of a JSON request body, and the sampling fields shared by completions and chat.

A wrong type or range is a 400 naming the field (`param`), as OpenAI answers. `null` means "not given".
Hand-written rather than pydantic models: the error messages stay OpenAI's, and a request costs a few
dict lookups.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.requests import Request

from argosy.engine.sampling_params import SamplingParams, SamplingParamsError
from argosy.server.errors import APIError

MAX_N = 128  # OpenAI's bound on n


async def read_json_body(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object; 413 past `max_bytes` (checked while reading, not after)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise APIError(413, f"Request body is over the limit of {max_bytes} bytes.", code="request_too_large")
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise APIError(413, f"Request body is over the limit of {max_bytes} bytes.", code="request_too_large")
        parts.append(chunk)
    try:
        body = json.loads(b"".join(parts), parse_constant=_no_constant, parse_float=finite_float)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError.bad_request(f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    except RecursionError:  # nested deeper than the parser goes
        raise APIError.bad_request("The request body is nested too deeply.", code="invalid_json") from None
    if b"\\ud" in b"".join(parts).lower() and has_lone_surrogate(body):
        raise APIError.bad_request("The request body has a lone UTF-16 surrogate (\\ud800-\\udfff) in a string.",
                                   code="invalid_json")
    if not isinstance(body, dict):
        raise APIError.bad_request("The request body must be a JSON object.", code="invalid_json")
    return body


def has_lone_surrogate(obj: Any) -> bool:
    """Whether a parsed JSON value holds a string that is not valid Unicode text (a `\\ud800` escape without
    its pair): such a string cannot be encoded, so a tokenizer fails on it. Only called when the raw body
    has such an escape at all (emoji written as surrogate pairs are fine and common)."""
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _no_constant(name: str) -> None:
    """NaN and Infinity are not JSON (RFC 8259), though Python's parser takes them: a NaN temperature
    would pass every range check."""
    raise ValueError(f"{name} is not a JSON value")


def finite_float(text: str) -> float:
    """A JSON number with a fraction or exponent; one past a double's range (1e999) is a 400 too, not the
    infinity Python makes of it (an infinite temperature passed the range check)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is out of a double's range")
    return value


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class Fields:
    """Reads fields of one request body with type checks."""

    def __init__(self, body: dict[str, Any]):
        self.body = body

    def _bad(self, name: str, expected: str) -> APIError:
        value = self.body.get(name)
        return APIError.bad_request(f"'{name}' must be {expected}, got {_type_name(value)}.", param=name)

    def get_int(self, name: str, default: int | None = None) -> int | None:
        value = self.body.get(name)
        if value is None:
            return default
        # JSON 2.0 arrives as float; bool is an int subclass in Python and never a count.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(name, "an integer")
        return value

    def get_float(self, name: str, default: float | None = None) -> float | None:
        value = self.body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(name, "a number")
        try:
            return float(value)
        except OverflowError:  # an integer of hundreds of digits
            raise self._bad(name, "a number within the range of a double") from None

    def get_bool(self, name: str, default: bool) -> bool:
        value = self.body.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(name, "a boolean")
        return value

    def get_str(self, name: str, default: str | None = None) -> str | None:
        value = self.body.get(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._bad(name, "a string")
        return value

    def get_dict(self, name: str) -> dict[str, Any] | None:
        value = self.body.get(name)
        if value is not None and not isinstance(value, dict):
            raise self._bad(name, "an object")
        return value

    def get_str_list(self, name: str) -> list[str]:
        """A string or a list of strings (`stop`)."""
        value = self.body.get(name)
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        raise self._bad(name, "a string or a list of strings")

    def get_int_list(self, name: str) -> list[int]:
        value = self.body.get(name)
        if value is None:
            return []
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return value
        raise self._bad(name, "a list of integers")

    def reject_unsupported(self, name: str, why: str) -> None:
        value = self.body.get(name)
        if value not in (None, {}, []):
            raise APIError.bad_request(f"'{name}' is not supported: {why}.", param=name)


def check_model(fields: Fields, served_name: str) -> None:
    """`model` may be left out (vLLM's default); a different name is OpenAI's 404 `model_not_found`."""
    model = fields.get_str("model")
    if model is not None and model != served_name:
        raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


def stream_flags(fields: Fields) -> tuple[bool, bool]:
    """(stream, include_usage); stream_options without stream is an error, as in OpenAI's API."""
    stream = fields.get_bool("stream", False)
    options = fields.get_dict("stream_options")
    if options is not None and not stream:
        raise APIError.bad_request("'stream_options' is only allowed when 'stream' is true.", "stream_options")
    include_usage = False
    if options:
        value = options.get("include_usage")
        if value is not None and not isinstance(value, bool):
            raise APIError.bad_request("'stream_options.include_usage' must be a boolean.", "stream_options")
        include_usage = bool(value)
    return stream, include_usage


def sampling_params(fields: Fields, *, max_tokens: int | None, logprobs: int | None,
                    max_tokens_field: str = "max_tokens", structured_outputs: Any = None,
                    prompt_logprobs: int | None = None) -> SamplingParams:
    """The sampling fields both endpoints share (OpenAI's and vLLM's extras) as SamplingParams.
    prompt_logprobs: the endpoint's own need for them (completions' echo with logprobs), beside vLLM's field."""
    if max_tokens is not None and max_tokens < 1:
        raise APIError.bad_request(f"{max_tokens_field} must be at least 1, got {max_tokens}.", max_tokens_field)
    n = fields.get_int("n", 1)
    assert n is not None
    if not 1 <= n <= MAX_N:
        raise APIError.bad_request(f"n must be between 1 and {MAX_N}, got {n}.", "n")
    best_of = fields.get_int("best_of")
    if best_of is not None and best_of != n:
        raise APIError.bad_request("best_of other than n is not supported.", "best_of")
    top_k = fields.get_int("top_k", 0)
    asked = fields.get_int("prompt_logprobs")
    if asked is not None and fields.body.get("stream") is True:  # as vLLM: they would come before any token
        raise APIError.bad_request("'prompt_logprobs' are not available when 'stream' is true.", "prompt_logprobs")
    if asked is not None:
        prompt_logprobs = asked if prompt_logprobs is None else max(asked, prompt_logprobs)
    try:
        return SamplingParams(
            n=n,
            temperature=fields.get_float("temperature", 1.0),
            top_p=fields.get_float("top_p", 1.0),
            top_k=top_k,
            min_p=fields.get_float("min_p", 0.0),
            seed=fields.get_int("seed"),
            presence_penalty=fields.get_float("presence_penalty", 0.0),
            frequency_penalty=fields.get_float("frequency_penalty", 0.0),
            repetition_penalty=fields.get_float("repetition_penalty", 1.0),
            stop=fields.get_str_list("stop"),
            stop_token_ids=fields.get_int_list("stop_token_ids"),
            max_tokens=max_tokens,
            min_tokens=fields.get_int("min_tokens", 0),
            ignore_eos=fields.get_bool("ignore_eos", False),
            logprobs=logprobs,
            skip_special_tokens=fields.get_bool("skip_special_tokens", True),
            include_stop_str_in_output=fields.get_bool("include_stop_str_in_output", False),
            logit_bias=logit_bias(fields),
            prompt_logprobs=prompt_logprobs,
            structured_outputs=structured_outputs,
        )
    except SamplingParamsError as exc:
        raise APIError.from_invalid(exc) from None


MAX_LOGIT_BIAS = 1 << 18  # entries: above the largest common vocabularies (Gemma's 256,000 tokens)


def logit_bias(fields: Fields) -> dict[int, float] | None:
    """OpenAI's `logit_bias`: an object of token ids (as strings, JSON keys being strings) to numbers."""
    value = fields.get_dict("logit_bias")
    if not value:
        return None
    if len(value) > MAX_LOGIT_BIAS:  # refused before a loop over it: no vocabulary has that many tokens
        raise APIError.bad_request(f"logit_bias holds {len(value):,} entries; at most {MAX_LOGIT_BIAS:,}.",
                                   "logit_bias")
    bias: dict[int, float] = {}
    for key, number in value.items():
        token = key.strip()
        if not (token.isascii() and token.isdigit()) or len(token) > 18:
            raise APIError.bad_request(f"logit_bias keys must be token ids, got {key[:40]!r}.", "logit_bias")
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise APIError.bad_request(f"logit_bias[{token}] must be a number, got {_type_name(number)}.",
                                       "logit_bias")
        try:
            bias[int(token)] = float(number)
        except OverflowError:  # an integer of hundreds of digits: clamped to +-100 like any other
            bias[int(token)] = float("inf") if number > 0 else float("-inf")
    return bias


def scheduling_fields(fields: Fields) -> tuple[int, str | None]:
    """vLLM's `priority` (lower runs first under the priority policy) and `cache_salt`."""
    priority = fields.get_int("priority", 0)
    cache_salt = fields.get_str("cache_salt")
    if cache_salt == "":
        raise APIError.bad_request("'cache_salt' must be a non-empty string.", "cache_salt")
    fields.get_str("user")  # accepted and unused: OpenAI clients send it for abuse tracking
    assert priority is not None
    return priority, cache_salt


# Names the server itself gives a chat template; chat_template_kwargs may not replace them (chat_template
# would let a request run a template of its own: vLLM asks an operator's flag for that).
_TEMPLATE_OWN = frozenset({"messages", "tools", "add_generation_prompt", "continue_final_message", "chat_template"})


def chat_template_options(fields: Fields) -> dict[str, Any]:
    """vLLM's chat template fields as apply_chat_template keywords: add_generation_prompt (true),
    continue_final_message (false; not with add_generation_prompt given true), chat_template_kwargs (the
    template's own switches, e.g. Qwen3's enable_thinking)."""
    continue_final = fields.get_bool("continue_final_message", False)
    if continue_final and fields.body.get("add_generation_prompt") is True:
        raise APIError.bad_request("continue_final_message and add_generation_prompt cannot both be true: one "
                                   "continues the last message, the other starts a new one.", "continue_final_message")
    options: dict[str, Any] = {"add_generation_prompt": fields.get_bool("add_generation_prompt", not continue_final),
                               "continue_final_message": continue_final}
    extra = fields.get_dict("chat_template_kwargs") or {}
    taken = sorted(_TEMPLATE_OWN.intersection(extra))
    if taken:
        raise APIError.bad_request(f"chat_template_kwargs may not set {', '.join(taken)}.", "chat_template_kwargs")
    return {**extra, **options}
