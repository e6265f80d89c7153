"""Reads what a request asks its output to follow: OpenAI's `response_format`, vLLM's `structured_outputs`
and its older `guided_*` fields. One of them at most; a bad schema, regex or grammar is a 400."""

from __future__ import annotations

import asyncio
from typing import Any

from argosy.engine.structured import StructuredOutputsError, StructuredOutputsParams
from argosy.server.errors import APIError
from argosy.server.protocol import Fields

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_STRUCTURED_KEYS = {"json", "regex", "choice", "grammar", "json_object", "structural_tag", "disable_any_whitespace",
                    # accepted as vLLM does; the grammar never admits properties the schema does not name anyway
                    "disable_additional_properties", "disable_fallback"}


def _response_format(value: dict[str, Any]) -> StructuredOutputsParams | None:
    kind = value.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True, param="response_format")
    if kind != "json_schema":
        raise APIError.bad_request(
            f"response_format.type must be text, json_object or json_schema, got {kind!r}.", "response_format")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise APIError.bad_request("response_format.json_schema must be an object with the schema.", "response_format")
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise APIError.bad_request("response_format.json_schema.name must be a string.", "response_format")
    if spec.get("strict") not in (None, True, False):
        raise APIError.bad_request("response_format.json_schema.strict must be a boolean.", "response_format")
    schema = spec.get("schema")
    if schema is None:  # OpenAI's schema is optional: then any JSON object
        return StructuredOutputsParams(json_object=True, param="response_format")
    if not isinstance(schema, dict):
        raise APIError.bad_request("response_format.json_schema.schema must be a JSON schema object.",
                                   "response_format")
    # strict or not, the output follows the schema: decoding cannot leave it (OpenAI's strict mode).
    return StructuredOutputsParams(json=schema, param="response_format")


def _structured_outputs(value: dict[str, Any], param: str = "structured_outputs") -> StructuredOutputsParams:
    unknown = sorted(set(value) - _STRUCTURED_KEYS)
    if unknown:
        raise APIError.bad_request(f"structured_outputs.{unknown[0]} is not supported.", param)
    kwargs = {k: v for k, v in value.items() if k in ("json", "regex", "choice", "grammar", "structural_tag")}
    for key in ("regex", "grammar"):
        if kwargs.get(key) is not None and not isinstance(kwargs[key], str):
            raise APIError.bad_request(f"{param}: {key} must be a string.", param)
    if kwargs.get("choice") is not None and not isinstance(kwargs["choice"], list):
        raise APIError.bad_request(f"{param}: choice must be a list of strings.", param)
    if kwargs.get("json") is not None and not isinstance(kwargs["json"], dict | str):
        raise APIError.bad_request(f"{param}: json must be a JSON schema.", param)
    flags = {}
    for key in ("json_object", "disable_any_whitespace"):
        if value.get(key) is not None:
            if not isinstance(value[key], bool):
                raise APIError.bad_request(f"{param}: {key} must be a boolean.", param)
            flags[key] = value[key]
    return StructuredOutputsParams(**kwargs, **flags, param=param)


def parse_structured_outputs(fields: Fields) -> StructuredOutputsParams | None:
    """The request's grammar, from whichever field carries it; a 400 when two do, or one is malformed."""
    found: list[tuple[str, StructuredOutputsParams]] = []
    try:
        response_format = fields.get_dict("response_format")
        if response_format and (params := _response_format(response_format)) is not None:
            found.append(("response_format", params))
        structured = fields.get_dict("structured_outputs")
        if structured:
            found.append(("structured_outputs", _structured_outputs(structured)))
        for name, kind in _GUIDED.items():
            value = fields.body.get(name)
            if value is not None:
                found.append((name, _structured_outputs({kind: value}, param=name)))
    except StructuredOutputsError as exc:
        raise APIError.from_invalid(exc) from None
    if fields.body.get("guided_whitespace_pattern") is not None:
        raise APIError.bad_request("guided_whitespace_pattern is not supported; use "
                                   "structured_outputs.disable_any_whitespace.", "guided_whitespace_pattern")
    if len(found) > 1:
        raise APIError.bad_request(f"{found[0][0]} and {found[1][0]} both constrain the output: give one.",
                                   found[1][0])
    return found[0][1] if found else None


async def check_grammar(params: StructuredOutputsParams | None) -> None:
    """Builds the grammar (cached by spec) in a worker thread, so a large schema never blocks the event
    loop and a bad one is a 400 here rather than an engine error."""
    if params is None:
        return
    try:
        await asyncio.to_thread(params.to_grammar)
    except StructuredOutputsError as exc:
        raise APIError.from_invalid(exc) from None
