"""Bad requests get OpenAI error bodies with the right 4xx, and the server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server_fixtures import MODEL_NAME, ServerProcess

MAX_MODEL_LEN = 128
MAX_BODY = 16384


@pytest.fixture(scope="module")
def server(tiny_llama):
    with ServerProcess(tiny_llama, "--max-model-len", str(MAX_MODEL_LEN), "--max-body-bytes", str(MAX_BODY)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as c:
        yield c


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def _still_serves(server) -> None:
    r = httpx.post(server.base_url + "/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("body, param", [
    ({"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "Hi", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "Hi", "max_tokens": MAX_MODEL_LEN + 1}, "max_tokens"),
    ({"prompt": [5] * (MAX_MODEL_LEN + 10)}, "prompt"),
    ({"prompt": [5, 999_999]}, "prompt"),
    ({"prompt": [5, -1]}, "prompt"),
    ({"prompt": "Hi", "n": 0}, "n"),
    ({"prompt": "Hi", "n": 1000}, "n"),
    ({"prompt": "Hi", "temperature": -0.5}, "temperature"),
    ({"prompt": "Hi", "temperature": "hot"}, "temperature"),
    ({"prompt": "Hi", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "Hi", "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": "Hi", "stream": "yes"}, "stream"),
    ({"prompt": "Hi", "stop": [1, 2]}, "stop"),
    ({"prompt": "Hi", "top_p": 0}, "top_p"),
    ({"prompt": "Hi", "logprobs": 50}, "logprobs"),
    ({"prompt": "Hi", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": {"text": "Hi"}}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({}, "prompt"),
])
def test_bad_completion_requests_are_400(server, body, param):
    error = _error(httpx.post(server.base_url + "/completions", json=body, timeout=30), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "Hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 7}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function"}]}, "tools"),
])
def test_bad_chat_requests_are_400(server, body, param):
    error = _error(httpx.post(server.base_url + "/chat/completions", json=body, timeout=30), 400)
    assert error["param"] == param


def test_malformed_json_and_non_object_bodies(server):
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        r = httpx.post(server.base_url + "/completions", content=raw, headers={"content-type": "application/json"})
        assert _error(r, 400)["code"] == "invalid_json"
    _still_serves(server)


def test_a_number_past_a_doubles_range_is_not_infinity(server):
    """NaN and Infinity were 400s, but 1e999 (valid JSON) became an infinite temperature or repetition
    penalty, which passed every range check and sampled garbage."""
    for field in ("temperature", "repetition_penalty", "length_penalty"):
        for number in ("1e999", "-1e999"):
            raw = b'{"prompt": "Hi", "max_tokens": 2, "%s": %s}' % (field.encode(), number.encode())
            r = httpx.post(server.base_url + "/completions", content=raw, headers={"content-type": "application/json"})
            assert _error(r, 400)["code"] == "invalid_json", (field, number)
    r = httpx.post(server.base_url + "/completions", content=b'{"prompt": "Hi", "max_tokens": 2, "temperature": 1e-9}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    _still_serves(server)


def test_unknown_model_is_404_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="no-such-model", prompt="Hi", max_tokens=2)
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=MAX_MODEL_LEN * 2)
    assert info.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], n=500)


def test_body_over_the_limit_is_413(server):
    big = {"prompt": "x" * (MAX_BODY + 1)}
    assert _error(httpx.post(server.base_url + "/completions", json=big, timeout=30), 413)["code"]
    # Chunked upload, no Content-Length: the limit holds while reading.
    chunks = iter([b'{"prompt": "', b"y" * MAX_BODY, b'"}'])
    r = httpx.post(server.base_url + "/completions", content=chunks, headers={"content-type": "application/json"})
    _error(r, 413)
    _still_serves(server)


def test_unknown_routes_and_methods(server):
    assert _error(httpx.get(server.url + "/v1/nothing"), 404)["code"] == "not_found"
    assert _error(httpx.post(server.url + "/v2/completions", json={}), 404)["code"] == "not_found"
    _error(httpx.get(server.base_url + "/completions"), 405)


def test_detokenize_rejects_bad_ids(server):
    assert _error(httpx.post(server.url + "/detokenize", json={"tokens": [1, 10**9]}), 400)["param"] == "tokens"
    assert _error(httpx.post(server.url + "/detokenize", json={"tokens": "abc"}), 400)["param"] == "tokens"


def test_server_survives_every_error(server):
    _still_serves(server)
    assert httpx.get(server.url + "/health").status_code == 200
