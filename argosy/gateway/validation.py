"""Type and range checks of every body field the gateway itself reads, before anything acts on them.

The gateway forwards bodies unchanged, so fields it does not read are the upstream's to check. The
ones it does read (to route, estimate tokens, apply guardrails, pick a revision) are checked here and
a bad one is a 400 naming the field (`param`), in OpenAI's error format, as OpenAI and vLLM answer.
`null` means "not given" for optional fields; a count like max_tokens may be written 2.0 (as the engine
accepts), token ids must be integers.
"""

from __future__ import annotations

from typing import Any

from argosy.gateway.errors import GatewayError, bad_request

MAX_TOKENS = 2**31 - 1  # a bound on max_tokens: any real context is far shorter


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), type(value).__name__)


def invalid(param: str, expected: str, value: Any) -> GatewayError:
    return bad_request(f"'{param}' must be {expected}, got {_kind(value)}", param, "invalid_type")


def _is_int(value: Any) -> bool:
    # bool is an int subclass in Python and never a count; 2.0 arrives from some JSON encoders.
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer())


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def check_body(path: str, req: Any) -> None:
    """Raise a 400 GatewayError for the first field the gateway reads that has a wrong type or range."""
    if not isinstance(req, dict):
        raise bad_request(f"the body must be a JSON object, got {_kind(req)}", None, "invalid_json")
    model = req.get("model")
    if not isinstance(model, str) or not model:
        if "model" not in req or model is None:
            raise bad_request("the body must name a 'model'", "model", "missing_required_parameter")
        raise invalid("model", "a non-empty string", model)
    if req.get("stream") is not None and not isinstance(req["stream"], bool):
        raise invalid("stream", "a boolean", req["stream"])
    if req.get("user") is not None and not isinstance(req["user"], str):
        raise invalid("user", "a string", req["user"])
    for name in ("max_tokens", "max_completion_tokens"):
        value = req.get(name)
        if value is None:
            continue
        if not _is_int(value):
            raise invalid(name, "an integer", value)
        least = 0 if path == "/v1/completions" and req.get("echo") is True else 1  # 0: the echoed prompt alone
        if not least <= value <= MAX_TOKENS:
            raise bad_request(f"'{name}' must be between {least} and {MAX_TOKENS}, got {value}", name, "invalid_value")
    n = req.get("n")
    if n is not None and not _is_int(n):
        raise invalid("n", "an integer", n)
    if n is not None and not 1 <= n <= MAX_TOKENS:  # 1e300 had made a 300-digit token estimate
        raise bad_request(f"'n' must be between 1 and {MAX_TOKENS}, got {n}", "n", "invalid_value")
    options = req.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise invalid("stream_options", "an object", options)
        if options.get("include_usage") is not None and not isinstance(options["include_usage"], bool):
            raise invalid("stream_options", "an object whose include_usage is a boolean", options["include_usage"])
    if path == "/v1/chat/completions" or path == "/tokenize" and "messages" in req:
        _check_messages(req)
    elif path == "/tokenize":
        if not isinstance(req.get("prompt"), str):
            raise invalid("prompt", "a string (or give 'messages')", req.get("prompt"))
    elif path == "/detokenize":
        tokens = req.get("tokens")
        if not (tokens == [] or _token_ids(tokens)):
            raise invalid("tokens", "an array of token ids (integers >= 0)", tokens)
    elif path in ("/v1/rerank", "/rerank"):
        _check_rerank(req, "documents" if path == "/v1/rerank" else "texts")
    elif path == "/embed":
        _check_prompt(req, "inputs")
    else:
        _check_prompt(req, "prompt" if path == "/v1/completions" else "input")


def _check_messages(req: dict[str, Any]) -> None:
    messages = req.get("messages")
    if messages is None:
        raise bad_request("the body must have 'messages'", "messages", "missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "a non-empty array of message objects", messages)
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise invalid(f"messages[{i}]", "an object", m)
        if not isinstance(m.get("role"), str):
            raise invalid(f"messages[{i}].role", "a string", m.get("role"))
        content = m.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise invalid(f"messages[{i}].content", "a string or an array of content parts", content)
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise invalid(f"messages[{i}].content[{j}]", "an object", part)
            if "text" in part and not isinstance(part["text"], str):
                raise invalid(f"messages[{i}].content[{j}].text", "a string", part["text"])


def _check_rerank(req: dict[str, Any], name: str) -> None:
    """A query string and a non-empty array of documents: strings, or objects with a `text` string."""
    if not isinstance(req.get("query"), str):
        raise invalid("query", "a string", req.get("query"))
    docs = req.get(name)
    ok = isinstance(docs, list) and bool(docs) and all(
        isinstance(d, str) or (isinstance(d, dict) and isinstance(d.get("text"), str)) for d in docs)
    if not ok:
        raise invalid(name, "a non-empty array of strings (or objects with a 'text' string)", docs)


def _check_prompt(req: dict[str, Any], name: str) -> None:
    """A string, an array of strings, an array of token ids, or an array of arrays of token ids."""
    value = req.get(name)
    if value is None:
        raise bad_request(f"the body must have '{name}'", name, "missing_required_parameter")
    if isinstance(value, str):
        return
    ok = isinstance(value, list) and bool(value) and (
        all(isinstance(x, str) for x in value) or _token_ids(value) or all(_token_ids(x) for x in value))
    if not ok:
        raise invalid(name, "a string, an array of strings, an array of token ids (integers >= 0) or an array "
                      "of such arrays", value)
