"""`argosy engine` serving encoder checkpoints as real subprocesses: the official openai client on
/v1/embeddings, plain HTTP on /v1/rerank and TEI's /embed and /rerank, and the errors (OpenAI's shape
on /v1/*, TEI's on its routes; 413 past the batch size, 424 for the wrong kind of model)."""

from __future__ import annotations

import base64
import concurrent.futures

import httpx
import numpy as np
import openai
import pytest
import torch

from argosy.encoder import Encoder
from argosy.encoder.random_model import make_random_bert
from tests.server_fixtures import ServerProcess, metric

DOCS = ["paris is the capital of france", "a dog runs in the water", "red blue green", "music of the night"]


@pytest.fixture(scope="module")
def embed_dir(tmp_path_factory):
    return str(make_random_bert(tmp_path_factory.mktemp("embed"), "embed", max_position_embeddings=64))


@pytest.fixture(scope="module")
def rerank_dir(tmp_path_factory):
    return str(make_random_bert(tmp_path_factory.mktemp("rerank"), "rerank", seed=5))


@pytest.fixture(scope="module")
def embed_server(embed_dir):
    with ServerProcess(embed_dir, "--max-client-batch-size", "8", served_name="embed") as server:
        yield server


@pytest.fixture(scope="module")
def rerank_server(rerank_dir):
    with ServerProcess(rerank_dir, served_name="rerank") as server:
        yield server


def test_embeddings_through_the_openai_client(embed_server, embed_dir):
    client = openai.OpenAI(base_url=embed_server.base_url, api_key="none")
    expected = Encoder(embed_dir).embed(DOCS)
    got = client.embeddings.create(model="embed", input=DOCS)
    assert [d.index for d in got.data] == [0, 1, 2, 3]
    assert torch.allclose(torch.tensor([d.embedding for d in got.data]), expected, atol=1e-6)
    tokens = Encoder(embed_dir).engine.tokenizer.encode_texts(DOCS, 64, False)
    assert got.usage.prompt_tokens == got.usage.total_tokens == sum(map(len, tokens))
    one = client.embeddings.create(model="embed", input=DOCS[0])
    assert torch.allclose(torch.tensor(one.data[0].embedding), expected[0], atol=1e-6)
    # The client asks for base64 by default when numpy is around; decode it by hand too.
    raw = httpx.post(embed_server.base_url + "/embeddings",
                     json={"model": "embed", "input": DOCS[:2], "encoding_format": "base64"}).json()
    vec = np.frombuffer(base64.b64decode(raw["data"][1]["embedding"]), dtype="<f4")
    assert np.allclose(vec, expected[1].numpy(), atol=1e-6)
    ids = Encoder(embed_dir).engine.tokenizer.encode_texts(DOCS[:2], 64, False)
    by_ids = client.embeddings.create(model="embed", input=ids)
    assert torch.allclose(torch.tensor([d.embedding for d in by_ids.data]), expected[:2], atol=1e-6)
    flat = client.embeddings.create(model="embed", input=ids[0])
    assert torch.allclose(torch.tensor(flat.data[0].embedding), expected[0], atol=1e-6)


def test_embedding_errors(embed_server):
    client = openai.OpenAI(base_url=embed_server.base_url, api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="Matryoshka") as e:
        client.embeddings.create(model="embed", input="x", dimensions=16)
    assert e.value.body["param"] == "dimensions"
    client.embeddings.create(model="embed", input="x", dimensions=64)  # its own size is fine
    with pytest.raises(openai.APIStatusError) as e:
        client.embeddings.create(model="embed", input=["a"] * 9)
    assert e.value.status_code == 413 and e.value.body["code"] == "too_many_inputs"
    with pytest.raises(openai.BadRequestError, match="over this model's limit of 64"):
        client.embeddings.create(model="embed", input=["ok", "dog " * 80])
    cut = client.embeddings.create(model="embed", input="dog " * 80, extra_body={"truncate": True})
    assert cut.usage.prompt_tokens == 64
    cut = client.embeddings.create(model="embed", input="dog " * 80, extra_body={"truncate_prompt_tokens": 10})
    assert cut.usage.prompt_tokens == 10
    for bad in ([], [""], [1, "a"], [[]], {"a": 1}, [[1, True]]):
        r = httpx.post(embed_server.base_url + "/embeddings", json={"model": "embed", "input": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input", bad
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="other", input="x")
    r = httpx.post(embed_server.base_url + "/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 424 and r.json()["error"]["code"] == "wrong_model_kind"
    assert "/v1/embeddings" in r.json()["error"]["message"]


def test_rerank_shapes_on_a_cross_encoder(rerank_server, rerank_dir):
    expected = Encoder(rerank_dir).score("capital of france", DOCS)
    order = expected.argsort(descending=True).tolist()
    r = httpx.post(rerank_server.base_url + "/rerank",
                   json={"model": "rerank", "query": "capital of france", "documents": DOCS, "top_n": 2})
    body = r.json()
    assert r.status_code == 200 and [x["index"] for x in body["results"]] == order[:2]
    assert body["results"][0]["document"] == {"text": DOCS[order[0]]}
    assert abs(body["results"][0]["relevance_score"] - expected[order[0]].item()) < 1e-5
    assert body["usage"]["total_tokens"] > 0
    docs_as_objects = [{"text": d} for d in DOCS]
    r = httpx.post(rerank_server.base_url + "/rerank", json={"query": "capital of france", "documents": docs_as_objects,
                                                             "return_documents": False})
    assert [x["index"] for x in r.json()["results"]] == order and "document" not in r.json()["results"][0]
    tei = httpx.post(rerank_server.url + "/rerank", json={"query": "capital of france", "texts": DOCS,
                                                          "return_text": True}).json()
    assert [x["index"] for x in tei] == order and tei[0]["text"] == DOCS[order[0]]
    assert [round(x["score"], 5) for x in tei] == [round(expected[i].item(), 5) for i in order]
    raw = httpx.post(rerank_server.url + "/rerank", json={"query": "capital of france", "texts": DOCS,
                                                          "raw_scores": True}).json()
    assert abs(torch.sigmoid(torch.tensor(raw[0]["score"])).item() - tei[0]["score"]) < 1e-5


def test_rerank_errors_in_each_shape(rerank_server):
    r = httpx.post(rerank_server.url + "/rerank", json={"query": "q", "texts": ["dog " * 200]})
    assert r.status_code == 413 and r.json() == {"error": r.json()["error"], "error_type": "Validation"}
    r = httpx.post(rerank_server.url + "/rerank", json={"query": "q", "texts": ["dog " * 200], "truncate": True})
    assert r.status_code == 200
    r = httpx.post(rerank_server.url + "/embed", json={"inputs": "x"})
    assert r.status_code == 424 and r.json()["error_type"] == "Backend"
    r = httpx.post(rerank_server.base_url + "/embeddings", json={"input": "x"})
    assert r.status_code == 424 and r.json()["error"]["code"] == "wrong_model_kind"
    r = httpx.post(rerank_server.base_url + "/rerank", json={"query": "q", "documents": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents"
    r = httpx.post(rerank_server.base_url + "/rerank", json={"query": "q", "documents": ["a"], "top_n": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_n"
    r = httpx.post(rerank_server.url + "/rerank", json={"query": 3, "texts": ["a"]})
    assert r.status_code == 400 and "error_type" in r.json()


def test_bi_encoder_reranks_by_cosine_and_tei_embed(embed_server, embed_dir):
    enc = Encoder(embed_dir)
    expected = enc.score("capital of france", DOCS)
    r = httpx.post(embed_server.url + "/rerank", json={"query": "capital of france", "texts": DOCS}).json()
    assert [x["index"] for x in r] == expected.argsort(descending=True).tolist()
    assert abs(r[0]["score"] - expected.max().item()) < 1e-5
    vectors = httpx.post(embed_server.url + "/embed", json={"inputs": DOCS[:2]}).json()
    assert torch.allclose(torch.tensor(vectors), enc.embed(DOCS[:2]), atol=1e-6)


def test_concurrent_requests_are_batched_and_all_answered(embed_server, embed_dir):
    expected = Encoder(embed_dir).embed(DOCS)
    batches_before = metric(embed_server.metrics(), "vllm:request_success_total")

    def one(i: int) -> list[float]:
        r = httpx.post(embed_server.base_url + "/embeddings", json={"input": DOCS[i % 4]}, timeout=60)
        r.raise_for_status()
        return r.json()["data"][0]["embedding"]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, range(48)))
    for i, vec in enumerate(got):
        assert torch.allclose(torch.tensor(vec), expected[i % 4], atol=1e-6)
    samples = embed_server.metrics()
    assert metric(samples, "vllm:request_success_total") - batches_before == 48
    assert metric(samples, "argosy:encoder_queued_tokens") == 0
    models = httpx.get(embed_server.base_url + "/models").json()["data"][0]
    assert (models["id"], models["kind"], models["dimensions"], models["max_model_len"]) == ("embed", "embed", 64, 64)
