"""Model kinds at the gateway: which endpoints each kind serves, and the encoder endpoints' bodies.

A fleet file's model has a `kind`: generate (chat and completions), embed (embeddings, and rerank by
embedding similarity) or rerank (a cross-encoder). A request for an endpoint its model's kind does not
serve is refused before it is queued: 424, TEI's status for the wrong kind of model, with a message
that names what the model serves. TEI's routes (/embed, /rerank) carry no `model`: the fleet's one model
serving the route is meant (a cross-encoder first, for /rerank), else the request must name one.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from argosy.gateway.errors import GatewayError, bad_request

ENDPOINTS = {"generate": ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"),
             "embed": ("/v1/embeddings", "/embed", "/v1/rerank", "/rerank"),
             "rerank": ("/v1/rerank", "/rerank")}
ENCODER_PATHS = frozenset({"/v1/embeddings", "/embed", "/v1/rerank", "/rerank"})
TEI_PATHS = frozenset({"/embed", "/rerank"})
# vLLM's tokenizer routes: a replica's tokenizer, nothing generated, so no tokens billed, no guardrail, shadow or
# rollout sample, and no prompt for the prefix index (a tokenized prompt leaves no KV behind on the replica).
# Like vLLM's, their `model` may be left out where the fleet has one model serving them.
TOKENIZER_PATHS = frozenset({"/tokenize", "/detokenize"})
DEFAULT_MODEL_PATHS = TEI_PATHS | TOKENIZER_PATHS
_USAGE_TAIL = re.compile(rb'"usage"\s*:\s*\{[^{}]*"total_tokens"\s*:\s*(\d+)')


def check_endpoint(model: str, kind: str, path: str) -> None:
    if path not in ENDPOINTS[kind]:
        raise GatewayError(424, f"the model {model!r} is of kind {kind}: it serves {', '.join(ENDPOINTS[kind])}, "
                           f"not {path}", "invalid_request_error", "wrong_model_kind", "model")


def default_model(path: str, kinds: dict[str, str]) -> str:
    """The model a TEI or tokenizer request without `model` goes to: the only one serving the route."""
    serving = [name for name, kind in kinds.items() if path in ENDPOINTS[kind]]
    if path == "/rerank" and any(kinds[n] == "rerank" for n in serving):
        serving = [n for n in serving if kinds[n] == "rerank"]  # a cross-encoder before a bi-encoder
    if len(serving) == 1:
        return serving[0]
    if not serving:
        raise GatewayError(424, f"no model in this fleet serves {path}", "invalid_request_error", "wrong_model_kind",
                           "model")
    raise bad_request(f"several models serve {path} ({', '.join(serving)}): name one in 'model'", "model")


def with_default_model(body: bytes, path: str, kinds: dict[str, str]) -> bytes:
    """A TEI or tokenizer body without `model` gets the fleet's one model serving the route (else refused)."""
    try:
        req = json.loads(body)
    except (ValueError, RecursionError):
        return body  # not JSON: the body check refuses it
    if not isinstance(req, dict) or "model" in req:
        return body
    return json.dumps({**req, "model": default_model(path, kinds)}).encode()


def tei_error_body(e: GatewayError) -> bytes:
    """A gateway error on TEI's routes, in TEI's shape."""
    kinds = {413: "Validation", 424: "Backend", 429: "Overloaded", 503: "Unhealthy"}
    return json.dumps({"error": e.message, "error_type": kinds.get(e.status, "Validation")}).encode()


def _texts(value: Any) -> tuple[list[str], int]:
    """(texts, exact token count of token-id inputs) of an embeddings `input` / TEI `inputs`."""
    if isinstance(value, str):
        return [value], 0
    if not isinstance(value, list):
        return [], 0
    if value and all(isinstance(x, int) for x in value):
        return [], len(value)
    texts = [x for x in value if isinstance(x, str)]
    return texts, sum(len(x) for x in value if isinstance(x, list))


def _documents(value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    return [d["text"] if isinstance(d, dict) and isinstance(d.get("text"), str) else d for d in value
            if isinstance(d, str) or (isinstance(d, dict) and isinstance(d.get("text"), str))]


def encoder_prompt(path: str, req: dict, kind: str) -> tuple[str, int, list[str]]:
    """(routing text, estimated tokens, the texts input guardrails see) of an encoder request.

    Rerank on a cross-encoder runs the query once per document, so its estimate counts it that many times.
    """
    if path in ("/v1/embeddings", "/embed"):
        texts, id_tokens = _texts(req.get("input" if path == "/v1/embeddings" else "inputs"))
        text = "\x1e".join(texts)
        return text, id_tokens + sum(math.ceil(len(t) / 4) + 2 for t in texts), texts
    query = req.get("query") if isinstance(req.get("query"), str) else ""
    docs = _documents(req.get("documents" if path == "/v1/rerank" else "texts"))
    q = math.ceil(len(query) / 4)
    doc_tokens = sum(math.ceil(len(d) / 4) + 2 for d in docs)
    tokens = doc_tokens + q * (len(docs) if kind == "rerank" else 1) + 2
    return query, tokens, [query, *docs]


def set_encoder_texts(path: str, req: dict, texts: list[str]) -> None:
    """Write (redacted) texts back where encoder_prompt found them."""
    it = iter(texts)
    if path in ("/v1/embeddings", "/embed"):
        field = "input" if path == "/v1/embeddings" else "inputs"
        value = req.get(field)
        req[field] = [next(it) if isinstance(x, str) else x for x in value] if isinstance(value, list) else next(it)
        return
    if isinstance(req.get("query"), str):
        req["query"] = next(it)
    field = "documents" if path == "/v1/rerank" else "texts"
    out = []
    for d in req.get(field) or []:
        if isinstance(d, str):
            d = next(it)
        elif isinstance(d, dict) and isinstance(d.get("text"), str):
            d = {**d, "text": next(it)}
        out.append(d)
    req[field] = out


def usage_total(output: list[bytes]) -> int | None:
    """total_tokens of a JSON response's `usage`, read from its tail (an embeddings response is mostly
    vectors: Argosy's replicas write usage last, so the body is not parsed whole); else parsed whole."""
    body = b"".join(output)
    m = _USAGE_TAIL.search(body[-400:])
    if m:
        return int(m.group(1))
    try:
        return int(json.loads(body)["usage"]["total_tokens"])
    except (ValueError, KeyError, TypeError):
        return None
