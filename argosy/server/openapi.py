"""The replica's OpenAPI document (`GET /openapi.json`): every route `argosy engine` serves, with the
request fields and ranges the handlers check (protocol.py, chat.py, completions.py, tokenize.py).

Data, not generated: the handlers read their fields by hand (OpenAI's error messages), so this is the
one place that says what they accept; tests/test_openapi.py checks that each documented path answers
and that each route is documented, and the fuzz runs (schemathesis) use it to make their cases.
"""

from __future__ import annotations

from typing import Any


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


INT = {"type": "integer"}
NUMBER = {"type": "number"}
BOOL = _nullable({"type": "boolean"})
TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}

SAMPLING: dict[str, Any] = {
    "model": _nullable({"type": "string"}),
    "n": _nullable({"type": "integer", "minimum": 1, "maximum": 128}),
    "best_of": _nullable({"type": "integer", "minimum": 1, "maximum": 128}),  # must equal n
    "temperature": _nullable({"type": "number", "minimum": 0}),
    "top_p": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
    "top_k": _nullable({"type": "integer", "minimum": -1}),
    "min_p": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
    "seed": _nullable(INT),
    "prompt_logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": 20}),  # vLLM's; not with stream
    "presence_penalty": _nullable({"type": "number", "minimum": -2, "maximum": 2}),
    "frequency_penalty": _nullable({"type": "number", "minimum": -2, "maximum": 2}),
    "repetition_penalty": _nullable({"type": "number", "exclusiveMinimum": 0}),
    "stop": {"anyOf": [{"type": "string", "minLength": 1},
                       {"type": "array", "items": {"type": "string", "minLength": 1}}, {"type": "null"}]},
    "stop_token_ids": _nullable({"type": "array", "items": {"type": "integer", "minimum": 0}}),
    "min_tokens": _nullable({"type": "integer", "minimum": 0}),
    "ignore_eos": BOOL,
    "skip_special_tokens": BOOL,
    "include_stop_str_in_output": BOOL,
    "logit_bias": _nullable({"type": "object", "additionalProperties": {"type": "number"},  # token id: bias,
                             "description": "token id (a string) to a bias added to its logit, clamped to "
                                            "[-100, 100]"}),
    "stream": BOOL,
    "stream_options": _nullable({"type": "object", "properties": {"include_usage": BOOL}}),  # with stream only
    "priority": _nullable(INT),
    "cache_salt": _nullable({"type": "string", "minLength": 1}),
    "user": _nullable({"type": "string"}),
}

TEXT_PART = {"type": "object", "required": ["type", "text"],
             "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"enum": ["system", "user", "assistant", "developer"]},
    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART}, {"type": "null"}]},
    "name": {"type": "string"}}}


def completion_request(max_model_len: int, model: dict | None = None) -> dict[str, Any]:
    return {"type": "object", "required": ["prompt"], "properties": {
        **SAMPLING, **({"model": model} if model else {}),
        "prompt": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1},
                             TOKEN_IDS, {"type": "array", "items": TOKEN_IDS, "minItems": 1}]},
        "max_tokens": _nullable({"type": "integer", "minimum": 0, "maximum": max_model_len}),  # 0: with echo only
        "echo": BOOL,
        "logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": 20}),  # with echo: the prompt's too
        "suffix": {"anyOf": [{"type": "null"}, {"const": ""}]}}}


def chat_request(max_model_len: int, model: dict | None = None) -> dict[str, Any]:
    max_tokens = _nullable({"type": "integer", "minimum": 1, "maximum": max_model_len})
    return {"type": "object", "required": ["messages"], "properties": {
        **SAMPLING, **({"model": model} if model else {}),
        "messages": {"type": "array", "items": MESSAGE, "minItems": 1},
        "max_tokens": max_tokens,
        "max_completion_tokens": max_tokens,
        "logprobs": BOOL,
        "top_logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": 20}),  # with logprobs only
        "add_generation_prompt": BOOL,
        "response_format": _nullable({"type": "object", "properties": {"type": {"const": "text"}}}),
        "tools": {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]},  # not supported
        "functions": {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}}}


ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "integer", "null"]}}}}}


def error(description: str) -> dict[str, Any]:
    schema = {"$ref": "#/components/schemas/Error"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def json_body(schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"required": True, "description": description, "content": {"application/json": {"schema": schema}}}


def ok(description: str, content_type: str = "application/json", schema: dict | None = None) -> dict[str, Any]:
    return {"description": description, "content": {content_type: {"schema": schema or {"type": "object"}}}}


GENERATE_ERRORS = {"400": error("a field of the wrong type or out of range, or a prompt too long"),
                   "401": error("no or a wrong API key (`argosy engine --api-key`)"),
                   "404": error("an unknown model"), "413": error("a body over --max-body-bytes"),
                   "503": error("the queue is full (with Retry-After)")}


def generate(summary: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"post": {"summary": summary, "requestBody": json_body(schema), "responses": {
        "200": {"description": "the completion, or with `stream` an SSE stream of chunks ending in `data: [DONE]`",
                "content": {"application/json": {"schema": {"type": "object"}},
                            "text/event-stream": {"schema": {"type": "string"}}}},
        **GENERATE_ERRORS}}}


def probe(summary: str, content_type: str = "application/json", *codes: str) -> dict[str, Any]:
    return {"get": {"summary": summary, "security": [], "responses": {
        "200": ok(summary, content_type), **{c: error("not (yet) ready") for c in codes}}}}


def document(served_model_name: str, max_model_len: int) -> dict[str, Any]:
    model = _nullable({"enum": [served_model_name]})  # another name is a 404 (left out: this one)
    tokenize = {"type": "object", "properties": {
        "model": model, "prompt": {"type": "string"}, "messages": {
            "type": "array", "items": MESSAGE, "minItems": 1}, "add_special_tokens": BOOL,
        "add_generation_prompt": BOOL, "return_token_strs": BOOL}}
    detokenize = {"type": "object", "required": ["tokens"], "properties": {
        "model": model,
        "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Argosy engine (argosy engine)", "version": "1",
                 "description": f"One engine serving `{served_model_name}` over the OpenAI API. With --api-key "
                                "(or ARGOSY_API_KEY) every route but /health, /ready and /metrics needs it."},
        "components": {"schemas": {"Error": ERROR},
                       "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}}},
        "security": [{"apiKey": []}, {}],
        "paths": {
            "/v1/completions": generate("OpenAI completions (and vLLM's sampling extras)",
                                        completion_request(max_model_len, model)),
            "/v1/chat/completions": generate("OpenAI chat completions, through the chat template",
                                             chat_request(max_model_len, model)),
            "/v1/models": {"get": {"summary": "the served model", "responses": {
                "200": ok("the model list"), "401": error("no or a wrong API key")}}},
            "/v1/models/{model}": {"get": {"summary": "one model", "parameters": [
                {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": ok("the model"), "401": error("no or a wrong API key"),
                              "404": error("no such model")}}},
            "/tokenize": {"post": {"summary": "text or messages to token ids", "requestBody": json_body(tokenize),
                                   "responses": {"200": ok("the token ids"), **GENERATE_ERRORS}}},
            "/detokenize": {"post": {"summary": "token ids to text", "requestBody": json_body(detokenize),
                                     "responses": {"200": ok("the text"), **GENERATE_ERRORS}}},
            "/health": probe("liveness: the process and its engine thread run", "application/json", "503"),
            "/ready": probe("readiness: the model is loaded and warmed up", "application/json", "503"),
            "/version": probe("Argosy's version (vLLM's /version)"),
            "/metrics": probe("Prometheus metrics (vllm:* names)", "text/plain"),
            "/openapi.json": {"get": {"summary": "this document", "responses": {
                "200": ok("the OpenAPI document"), "401": error("no or a wrong API key")}}},
        },
    }
