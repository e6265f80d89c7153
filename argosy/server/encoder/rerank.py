"""POST /v1/rerank (Cohere's and Jina's shape) and POST /rerank (TEI's), on one path.

    /v1/rerank  {model, query, documents: [str | {"text": str}], top_n?, return_documents? (true)}
                -> {id, model, results: [{index, relevance_score, document: {text}}], usage}
    /rerank     {query, texts, return_text? (false), raw_scores? (false)} -> [{index, score, text?}]

Both sort best first. A cross-encoder scores each (query, document) pair: the sigmoid of its logit
(raw_scores: the logit itself). An embedding model ranks by the cosine similarity of the query's and
each document's vectors (a bi-encoder's ranking: cheaper, and usually less precise than a
cross-encoder's).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import torch
from starlette.requests import Request
from starlette.responses import Response

from argosy.encoder.checkpoint import EMBED
from argosy.server.encoder.state import EncoderState, TEIError, truncation
from argosy.server.errors import APIError
from argosy.server.protocol import Fields, check_model, read_json_body
from argosy.server.state import dumps


def _documents(value: Any, param: str) -> list[str]:
    if not isinstance(value, list) or not value:
        raise APIError.bad_request(f"'{param}' must be a non-empty list of strings.", param)
    out = []
    for i, d in enumerate(value):
        if isinstance(d, dict) and isinstance(d.get("text"), str):
            d = d["text"]  # Cohere's and Jina's {"text": ...} documents
        if not isinstance(d, str):
            raise APIError.bad_request(f"'{param}[{i}]' must be a string (or an object with a 'text' string).",
                                       param)
        out.append(d)
    return out


async def score(state: EncoderState, query: Any, documents: list[str], body: dict[str, Any], arrival: float,
                raw: bool, openai_route: bool, param: str) -> tuple[list[float], int]:
    """One score per document, and the tokens the request used."""
    if not isinstance(query, str):
        raise APIError.bad_request("'query' must be a string.", "query")
    core = state.core
    max_len, cut, direction = truncation(body, core.max_model_len)
    state.admit(len(documents) + (1 if core.kind == EMBED else 0), param)
    tok = core.tokenizer
    if core.kind == EMBED:
        q = await state.tokenize(tok.encode_texts, [query], max_len, cut, direction, "query",
                                 openai_route=openai_route)
        ids = await state.tokenize(tok.encode_texts, documents, max_len, cut, direction, param,
                                   openai_route=openai_route)
        out = await state.run(q + ids, arrival, openai_route)
        scores = torch.nn.functional.cosine_similarity(out.data[:1], out.data[1:], dim=1)
        return scores.tolist(), out.num_tokens
    pairs = await state.tokenize(tok.encode_pairs, query, documents, max_len, cut, param, openai_route=openai_route)
    out = await state.run(pairs, arrival, openai_route)
    scores = out.data if raw else core.activate(out.data)
    return scores.tolist(), out.num_tokens


async def create_rerank(request: Request) -> Response:
    arrival = time.monotonic()
    state: EncoderState = request.app.state.argosy
    state.check_ready()
    body = await read_json_body(request, state.max_body_bytes)
    fields = Fields(body)
    check_model(fields, state.served_model_name)
    state.check_kind("/v1/rerank")
    documents = _documents(body.get("documents"), "documents")
    top_n = fields.get_int("top_n")
    if top_n is not None and top_n < 1:
        raise APIError.bad_request("'top_n' must be at least 1.", "top_n")
    return_documents = fields.get_bool("return_documents", True)
    scores, tokens = await score(state, body.get("query"), documents, body, arrival, False, True, "documents")
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]
    results = []
    for i in ranked:
        r: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if return_documents:
            r["document"] = {"text": documents[i]}
        results.append(r)
    return Response(dumps({"id": f"rerank-{uuid.uuid4().hex}", "model": state.served_model_name, "results": results,
                           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}).encode(),
                    media_type="application/json")


async def tei_rerank(request: Request) -> Response:
    try:
        arrival = time.monotonic()
        state: EncoderState = request.app.state.argosy
        state.check_ready()
        body = await read_json_body(request, state.max_body_bytes)
        fields = Fields(body)
        check_model(fields, state.served_model_name)
        state.check_kind("/rerank")
        texts = _documents(body.get("texts"), "texts")
        return_text = fields.get_bool("return_text", False)
        raw = fields.get_bool("raw_scores", False)
        scores, tokens = await score(state, body.get("query"), texts, body, arrival, raw, False, "texts")
    except APIError as e:
        raise TEIError.from_api(e) from None
    results = []
    for i in sorted(range(len(scores)), key=lambda i: -scores[i]):
        r: dict[str, Any] = {"index": i, "score": scores[i]}
        if return_text:
            r["text"] = texts[i]
        results.append(r)
    return Response(dumps(results).encode(), media_type="application/json",
                    headers={"x-argosy-usage-tokens": str(tokens)})
