"""The gateway's OpenAPI document (`GET /openapi.json`): every path the gateway answers.

The proxied bodies are the replica's (argosy/server/openapi.py) with `model` required, since the
gateway routes on it; the gateway forwards the rest as received, so what an upstream accepts is what
these schemas say for Argosy replicas. tests/test_openapi.py checks that each documented path answers
and that each path the gateway's code serves is documented.
"""

from __future__ import annotations

from typing import Any

from argosy.server.openapi import ERROR, chat_request, completion_request, error, json_body, ok

PROXIED_ERRORS = {
    "400": error("not a JSON object with a string `model`, a field the gateway reads of the wrong type, or "
                 "an upstream's 400"),
    "401": error("no or a wrong API key"), "403": error("this key may not use the model"),
    "404": error("an unknown model"), "413": error("a body over gateway.max_body_bytes"),
    "429": error("over the key's rate limit, or too many failed authentications (Retry-After)"),
    "503": error("at capacity, no live upstream, or an upstream failed before its first byte (Retry-After)"),
    "504": error("the upstream did not answer within gateway.first_byte_timeout_s (Retry-After)")}
ENCODER_ERRORS = {"424": error("the model's kind does not serve this endpoint (TEI's status for the wrong kind "
                               "of model), or no model in the fleet serves it")}
HEADERS = [
    {"name": "x-priority", "in": "header", "required": False, "schema": {"enum": ["batch"]},
     "description": "lower this request's priority (a key's priority is never raised)"},
    {"name": "x-session-id", "in": "header", "required": False, "schema": {"type": "string", "maxLength": 256},
     "description": "session affinity key (routing.session_header)"},
    {"name": "x-request-id", "in": "header", "required": False, "schema": {"type": "string", "maxLength": 128},
     "description": "the request's id in logs and traces (returned in the same header)"}]


def _with_model(schema: dict[str, Any], models: list[str]) -> dict[str, Any]:
    props = {**schema["properties"], "model": model_field(models)}
    return {**schema, "required": ["model", *schema["required"]], "properties": props}


def model_field(models: list[str]) -> dict[str, Any]:
    """The fleet's model names (any other is a 404)."""
    return {"enum": models} if models else {"type": "string", "minLength": 1}


def proxied(summary: str, schema: dict[str, Any], extra_errors: dict | None = None) -> dict[str, Any]:
    return {"post": {"summary": summary, "parameters": HEADERS, "requestBody": json_body(schema), "responses": {
        **(extra_errors or {}),
        "200": {"description": "the upstream's answer; with `stream`, SSE chunks ending in `data: [DONE]` (an "
                               "upstream failure after the first byte ends it with an error event, then [DONE])",
                "content": {"application/json": {"schema": {"type": "object"}},
                            "text/event-stream": {"schema": {"type": "string"}}}},
        **PROXIED_ERRORS}}}


def admin(summary: str, method: str, body: dict | None = None, params: list | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {
        "200": ok("done"), "400": error("a missing or wrong field"), "401": error("no or a wrong admin key"),
        "403": error("admin endpoints are disabled"), "404": error("no such upstream, key or route"),
        "429": error("too many failed authentications (Retry-After)")}}
    if body is not None:
        op["requestBody"] = json_body(body)
    if params:
        op["parameters"] = params
    return {method: op}


def public(summary: str, content_type: str = "application/json", *extra: str) -> dict[str, Any]:
    return {"get": {"summary": summary, "security": [], "responses": {
        "200": ok(summary, content_type), **{c: error("not found") for c in extra}}}}


def document(models: list[str] | None = None, max_model_len: int = 1 << 20) -> dict[str, Any]:
    models = models or []
    upstream = {"type": "object", "required": ["model", "url"], "properties": {
        "model": model_field(models), "url": {"type": "string", "pattern": "^https?://"},
        "revision": {"type": ["string", "null"]}}}
    new_key = {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "minLength": 1}, "models": {"type": ["array", "null"], "items": {"type": "string"}},
        "rpm": {"type": ["integer", "null"], "minimum": 1}, "tpm": {"type": ["integer", "null"], "minimum": 1},
        "priority": {"enum": ["interactive", "batch"]}}}
    embeddings = {"type": "object", "required": ["model", "input"], "properties": {
        "model": model_field(models),
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1},
                            {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}]},
        "encoding_format": {"enum": ["float", "base64"]}, "user": {"type": "string"}}}
    texts = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}
    tei_embed = {"type": "object", "required": ["inputs"], "properties": {
        "model": model_field(models), "inputs": texts, "normalize": {"type": "boolean"},
        "truncate": {"type": "boolean"}}}
    document_item = {"anyOf": [{"type": "string"}, {"type": "object", "required": ["text"],
                                                    "properties": {"text": {"type": "string"}}}]}
    rerank = {"type": "object", "required": ["model", "query", "documents"], "properties": {
        "model": model_field(models), "query": {"type": "string"},
        "documents": {"type": "array", "items": document_item, "minItems": 1},
        "top_n": {"type": "integer", "minimum": 1}, "return_documents": {"type": "boolean"}}}
    tei_rerank = {"type": "object", "required": ["query", "texts"], "properties": {
        "model": model_field(models), "query": {"type": "string"},
        "texts": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "return_text": {"type": "boolean"}, "raw_scores": {"type": "boolean"}}}
    tokenize = {"type": "object", "properties": {
        "model": model_field(models), "prompt": {"type": "string"},
        "messages": {"type": "array", "items": {"type": "object"}, "minItems": 1},
        "add_special_tokens": {"type": "boolean"}, "add_generation_prompt": {"type": "boolean"},
        "return_token_strs": {"type": "boolean"}}}
    detokenize = {"type": "object", "required": ["tokens"], "properties": {
        "model": model_field(models), "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}}}
    name = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
    model = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]
    return {
        "openapi": "3.1.0",
        "info": {"title": "Argosy gateway", "version": "1", "description":
                 "The front door: the OpenAI endpoints routed to a fleet's upstreams, with keys, limits, "
                 "admission, guardrails and health; admin endpoints behind the admin key."},
        "components": {"schemas": {"Error": ERROR},
                       "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}}},
        "security": [{"apiKey": []}, {}],
        "paths": {
            "/v1/completions": proxied("completions, routed",
                                       _with_model(completion_request(max_model_len), models)),
            "/v1/chat/completions": proxied("chat completions, routed",
                                            _with_model(chat_request(max_model_len), models)),
            "/v1/embeddings": proxied("embeddings, routed", embeddings, ENCODER_ERRORS),
            "/embed": proxied("TEI's embed, routed (without `model`: the fleet's one embedding model)", tei_embed,
                              ENCODER_ERRORS),
            "/v1/rerank": proxied("rerank (Cohere's and Jina's shape), routed", rerank, ENCODER_ERRORS),
            "/rerank": proxied("TEI's rerank, routed (without `model`: the fleet's one reranking model)",
                               tei_rerank, ENCODER_ERRORS),
            "/tokenize": proxied("vLLM's tokenize (a prompt or chat messages to token ids), on a replica of the model "
                                 "(without `model`: the fleet's one generating model)", tokenize, ENCODER_ERRORS),
            "/detokenize": proxied("vLLM's detokenize (token ids to text), on a replica of the model", detokenize,
                                   ENCODER_ERRORS),
            "/v1/models": {"get": {"summary": "the fleet's models", "responses": {
                "200": ok("the model list"), "401": error("no or a wrong API key"),
                "429": error("too many failed authentications (Retry-After)")}}},
            "/v1/models/{model}": {"get": {"summary": "one model's card (OpenAI's retrieve)", "parameters": model,
                                           "responses": {
                                               "200": ok("the model"), "401": error("no or a wrong API key"),
                                               "404": error("no such model"),
                                               "429": error("too many failed authentications (Retry-After)")}}},
            "/health": {**public("the gateway is up"), "head": public("the gateway is up")["get"]},
            "/version": public("Argosy's version (vLLM's /version)"),
            "/metrics": public("Prometheus metrics (argosy_gateway_*, argosy_fleet_*)", "text/plain"),
            "/metrics/targets": public("Prometheus HTTP service discovery of the replicas"),
            "/dashboard": public("the live dashboard page", "text/html"),
            "/dashboard/data": public("the dashboard's data"),
            "/dashboard/{file}": {"get": {"summary": "the dashboard's scripts and styles", "security": [],
                                          "parameters": [{"name": "file", "in": "path", "required": True,
                                                          "schema": {"type": "string"}}],
                                          "responses": {"200": ok("the file", "text/javascript"),
                                                        "404": error("no such file")}}},
            "/admin/upstreams": {**admin("every model's upstreams and their state", "get"),
                                 **admin("add an upstream", "post", upstream),
                                 **admin("remove an upstream", "delete", upstream)},
            "/admin/keys": {**admin("key names, limits and usage (never hashes)", "get"),
                            **admin("create a key (returned once)", "post", new_key)},
            "/admin/keys/{name}": admin("revoke a key", "delete", params=name),
            "/admin/keys/{name}/rotate": admin("a new secret for a key, same limits and usage (returned once)",
                                               "post", params=name),
            "/admin/fleet": admin("with argosy serve: nodes, replicas, autoscaler decisions", "get"),
            "/admin/rollouts": admin("with argosy serve: every managed model's rollout status", "get"),
            "/admin/rollouts/{model}": admin("with argosy serve: a model's split, rollout and history", "get",
                                             params=model),
            "/admin/rollouts/{model}/{action}": admin(
                "with argosy serve: start, promote, pause, resume or abort a rollout (docs/rollouts.md)", "post",
                {"type": "object", "properties": {"to": {"type": "string"}, "strategy": {
                    "enum": ["canary", "blue-green", "rolling"]}, "full": {"type": "boolean"},
                    "reason": {"type": "string"}}},
                params=model + [{"name": "action", "in": "path", "required": True,
                                 "schema": {"enum": ["start", "promote", "pause", "resume", "abort"]}}]),
            "/admin/shadow": admin("with argosy serve: shadow agreement of every model", "get"),
            "/admin/regions": admin("with regions: this gateway's region, the exchange's rounds and errors, and "
                                    "every other region's state as seen from here (docs/regions.md)", "get"),
            "/admin/preempt": admin("with argosy serve: a preemption notice for a node (its spot replicas drain "
                                    "and are replaced)", "post", {
                                        "type": "object", "required": ["node"], "properties": {
                                            "node": {"type": "string", "minLength": 1},
                                            "deadline_s": {"type": "number", "exclusiveMinimum": 0},
                                            "restore": {"type": "boolean"}}}),
            "/regions/exchange": {"post": {
                "summary": "gateway to gateway, with regions: state exchange, signed with the regions' shared "
                           "secret (docs/regions.md); 404 where regions are not configured",
                "security": [], "requestBody": json_body({"type": "object"}),
                "responses": {"200": ok("this region's state, signed"), "401": error("a missing or wrong signature"),
                              "404": error("this gateway has no regions")}}},
            "/admin/shadow/{model}": admin("with argosy serve: a model's shadow agreement", "get", params=model),
            "/openapi.json": public("this document"),
        },
    }
