"""The gateway's model kinds: which endpoints a kind serves, TEI's model-less bodies, token estimates
of encoder requests, usage read from a response's tail, and embedding tokens billed per key."""

from __future__ import annotations

import asyncio
import json

import pytest

from argosy.gateway.components import (
    check_endpoint,
    default_model,
    encoder_prompt,
    set_encoder_texts,
    usage_total,
)
from argosy.gateway.errors import GatewayError
from argosy.gateway.ratelimit import MemoryLimiter


@pytest.mark.parametrize("kind,path,ok", [
    ("generate", "/v1/chat/completions", True), ("generate", "/v1/embeddings", False),
    ("embed", "/v1/embeddings", True), ("embed", "/v1/rerank", True), ("embed", "/v1/completions", False),
    ("rerank", "/rerank", True), ("rerank", "/v1/embeddings", False), ("rerank", "/embed", False)])
def test_each_kind_serves_its_endpoints(kind, path, ok):
    if ok:
        check_endpoint("m", kind, path)
        return
    with pytest.raises(GatewayError) as e:
        check_endpoint("m", kind, path)
    assert e.value.status == 424 and e.value.code == "wrong_model_kind" and path in e.value.message


def test_a_tei_body_without_model_goes_to_the_one_model_serving_the_route():
    kinds = {"chat": "generate", "embed": "embed", "cross": "rerank"}
    assert default_model("/rerank", kinds) == "cross"  # the cross-encoder before the bi-encoder
    assert default_model("/embed", kinds) == "embed"
    with pytest.raises(GatewayError) as e:
        default_model("/embed", {**kinds, "embed2": "embed"})
    assert e.value.status == 400 and e.value.param == "model"
    with pytest.raises(GatewayError) as e:
        default_model("/rerank", {"chat": "generate"})
    assert e.value.status == 424


def test_encoder_token_estimates():
    _, n, texts = encoder_prompt("/v1/embeddings", {"input": [[1, 2, 3], [4, 5]]}, "embed")
    assert n == 5 and texts == []  # token ids: exact
    _, n, texts = encoder_prompt("/v1/embeddings", {"input": ["abcd" * 10, "x"]}, "embed")
    assert n == 12 + 3 and texts == ["abcd" * 10, "x"]
    req = {"query": "q" * 40, "documents": ["d" * 8, {"text": "e" * 8}]}
    _, cross, texts = encoder_prompt("/v1/rerank", req, "rerank")
    _, bi, _ = encoder_prompt("/v1/rerank", req, "embed")
    assert texts == ["q" * 40, "d" * 8, "e" * 8]
    assert cross - bi == 10  # a cross-encoder reads the query once per document
    set_encoder_texts("/v1/rerank", req, ["Q", "D", "E"])
    assert req == {"query": "Q", "documents": ["D", {"text": "E"}]}
    tei = {"query": "q", "texts": ["a", "b"]}
    set_encoder_texts("/rerank", tei, ["1", "2", "3"])
    assert tei == {"query": "1", "texts": ["2", "3"]}


def test_usage_is_read_from_the_tail_or_the_whole_body():
    body = json.dumps({"data": [{"embedding": [0.5] * 2000}], "usage": {"prompt_tokens": 7, "total_tokens": 7}})
    assert usage_total([body[:100].encode(), body[100:].encode()]) == 7
    first = json.dumps({"usage": {"prompt_tokens": 3, "total_tokens": 9}, "data": [{"embedding": [0.5] * 2000}]})
    assert usage_total([first.encode()]) == 9
    assert usage_total([b"[{\"index\": 0, \"score\": 0.5}]"]) is None


def test_encoder_tokens_are_billed_by_kind():
    """account(): an embeddings response's usage (read from its tail) is billed as input and as embed_tokens."""
    from types import SimpleNamespace

    from argosy.gateway.accounting import account
    from argosy.gateway.bodies import ProxiedRequest
    from argosy.gateway.keys import KeyRecord

    limiter, key = MemoryLimiter(), KeyRecord("app", "x")
    req = ProxiedRequest.parse("/v1/embeddings", json.dumps({"model": "e", "input": ["abc"] * 3}).encode(), 256)
    body = json.dumps({"data": [{"embedding": [0.1] * 1000}] * 3, "usage": {"prompt_tokens": 21, "total_tokens": 21}})
    call = SimpleNamespace(stream=False, output=[body.encode()], status=200, completion_events=0, model="e")
    asyncio.run(account(limiter, key, call, req, None, "embed"))
    asyncio.run(account(limiter, key, call, req, None, "embed"))
    usage = asyncio.run(limiter.get_usage("app"))
    assert (usage["requests"], usage["tokens"], usage["input_tokens"], usage["output_tokens"]) == (2, 42, 42, 0)
    assert usage["embed_tokens"] == 42 and usage["rerank_tokens"] == 0
