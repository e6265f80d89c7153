"""Bad input never wedges a model (issue 15, item 1): every body field the gateway reads is checked before
routing (a 400 in OpenAI's error format naming the field, never a 500), and an admission slot is released
on every path, so after any number of bad requests a good one is still served."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway_fixtures import start_gateway, start_upstream

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def upstream():
    up = start_upstream("u")
    yield up
    up.stop()


@pytest.fixture(scope="module")
def gateway(upstream):
    # A traffic split: the revision is picked from the `user` field (sticky sessions), which is where a
    # number once crashed the gateway with its slot held. max_in_flight 2: two leaked slots wedge it.
    gw = start_gateway({"models": [{
        "name": "m", "admission": {"max_in_flight": 2, "max_queue": 4, "queue_timeout_s": 1},
        "traffic": [{"revision": "v1", "weight": 1, "upstreams": [upstream.url]},
                    {"revision": "v2", "weight": 1, "upstreams": [upstream.url]}]},
        {"name": "e", "kind": "embed", "upstreams": [upstream.url]}]})  # embeddings go to an embedding model
    yield gw
    gw.stop()


def post(gw, path: str = "/v1/completions", **body) -> httpx.Response:
    return httpx.post(gw.url + path, json=body, timeout=30)


def assert_openai_400(r: httpx.Response, param: str | None) -> None:
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["message"] and err["param"] == param, err


def test_three_bad_requests_leave_the_model_serving(gateway):
    for _ in range(3):  # one more than max_in_flight
        assert_openai_400(post(gateway, model="m", prompt="hi", max_tokens=2, user=12345), "user")
    r = post(gateway, model="m", prompt="hi", max_tokens=2, user="alice")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"]


GOOD = {"/v1/completions": {"model": "m", "prompt": "hi", "max_tokens": 2},
        "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        "/v1/embeddings": {"model": "e", "input": "hi"}}
CASES = [  # (path, field, bad value, the param the error names)
    ("/v1/completions", "model", 7, "model"),
    ("/v1/completions", "model", ["m"], "model"),
    ("/v1/completions", "model", "", "model"),
    ("/v1/completions", "user", 12345, "user"),
    ("/v1/completions", "user", {"id": 1}, "user"),
    ("/v1/completions", "stream", "yes", "stream"),
    ("/v1/completions", "stream", 1, "stream"),
    ("/v1/completions", "max_tokens", "many", "max_tokens"),
    ("/v1/completions", "max_tokens", 2.5, "max_tokens"),
    ("/v1/completions", "max_tokens", True, "max_tokens"),
    ("/v1/completions", "max_tokens", -4, "max_tokens"),
    ("/v1/completions", "max_tokens", 0, "max_tokens"),
    ("/v1/completions", "max_tokens", 10**40, "max_tokens"),
    ("/v1/completions", "max_completion_tokens", [], "max_completion_tokens"),
    ("/v1/completions", "stream_options", "usage", "stream_options"),
    ("/v1/completions", "stream_options", {"include_usage": "yes"}, "stream_options"),
    ("/v1/completions", "prompt", None, "prompt"),
    ("/v1/completions", "prompt", 42, "prompt"),
    ("/v1/completions", "prompt", {"text": "hi"}, "prompt"),
    ("/v1/completions", "prompt", [], "prompt"),
    ("/v1/completions", "prompt", [1, "two"], "prompt"),
    ("/v1/completions", "prompt", [[1, 2], [-3]], "prompt"),
    ("/v1/chat/completions", "messages", "hi", "messages"),
    ("/v1/chat/completions", "messages", None, "messages"),
    ("/v1/chat/completions", "messages", [], "messages"),
    ("/v1/chat/completions", "messages", ["hi"], "messages[0]"),
    ("/v1/chat/completions", "messages", [{"role": 5, "content": "hi"}], "messages[0].role"),
    ("/v1/chat/completions", "messages", [{"role": "user", "content": 5}], "messages[0].content"),
    ("/v1/chat/completions", "messages", [{"role": "user", "content": ["hi"]}], "messages[0].content[0]"),
    ("/v1/chat/completions", "messages", [{"role": "user", "content": [{"type": "text", "text": 1}]}],
     "messages[0].content[0].text"),
    ("/v1/chat/completions", "user", 1.5, "user"),
    ("/v1/chat/completions", "max_completion_tokens", "4", "max_completion_tokens"),
    ("/v1/embeddings", "input", 3.14, "input"),
    ("/v1/embeddings", "input", [None], "input"),
]


@pytest.mark.parametrize(("path", "field", "value", "param"), CASES,
                         ids=[f"{p.removeprefix('/v1/').replace('/', '.')}-{f}-{v!r}"[:60] for p, f, v, _ in CASES])
def test_a_wrong_type_or_range_in_a_field_the_gateway_reads_is_a_400(gateway, path, field, value, param):
    body = {**GOOD[path], field: value}
    if value is None:
        del body[field]
    assert_openai_400(post(gateway, path, **body), param)


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1, 2]", b'"m"', b"null", b"[" * 100_000 + b"]" * 100_000,
                                 b'{"model": "m", "prompt": "hi", "max_tokens": NaN}', b"\xff\xfe{}",
                                 b'{"model": "m", "prompt": "hi", "temperature": 1e999}'])  # not infinity
def test_a_body_that_is_not_a_json_object_is_a_400(gateway, raw):
    r = httpx.post(gateway.url + "/v1/completions", content=raw, timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, (r.status_code, r.text)
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_good_requests_of_every_shape_still_pass(gateway):
    ok = [("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 2.0, "stream": None, "user": None}),
          ("/v1/completions", {"prompt": [1, 2, 3], "max_completion_tokens": 3}),
          ("/v1/completions", {"prompt": [[1, 2], [3]], "stream_options": None}),
          ("/v1/completions", {"prompt": "score me", "max_tokens": 0, "echo": True, "logprobs": 1}),  # the prompt alone
          ("/v1/chat/completions", {"messages": [{"role": "system", "content": None},
                                                 {"role": "user", "content": [{"type": "text", "text": "hi"},
                                                                              {"type": "image_url"}]}]}),
          ("/v1/embeddings", {"input": ["a", "b"]})]
    for path, extra in ok:
        r = post(gateway, path, **{**GOOD[path], **extra})
        assert r.status_code == 200, (path, extra, r.text)


def test_an_admission_slot_is_released_when_handling_fails_or_is_cancelled(monkeypatch):
    """In process, on the ASGI app: a bug after admission (here: picking the revision raises) and a client
    that goes away while its request hangs upstream both give the slot back."""
    import asyncio

    from argosy.config import parse_fleet
    from argosy.gateway.app import Gateway
    from argosy.gateway.traffic import ModelRuntime

    async def scenario() -> None:
        async def never_answer(reader, writer):
            await reader.read()  # accept, read, never answer

        hang = await asyncio.start_server(never_answer, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{hang.sockets[0].getsockname()[1]}"
        gw = Gateway(parse_fleet({"models": [{"name": "m", "upstreams": [url],
                                              "admission": {"max_in_flight": 1, "queue_timeout_s": 1}}]}, "test"))
        await gw.startup()
        adm = gw.models["m"].admission
        body = b'{"model": "m", "prompt": "hi", "max_tokens": 2}'

        async def call() -> list[dict]:
            sent: list[dict] = []
            msgs = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive() -> dict:
                if msgs:
                    return msgs.pop()
                await asyncio.Event().wait()  # the client stays until cancelled
                return {"type": "http.disconnect"}

            async def send(m: dict) -> None:
                sent.append(m)

            await gw({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive, send)
            return sent

        try:
            def broken(self, session_key, wanted=None):
                raise RuntimeError("a bug after admission")

            with monkeypatch.context() as mp:
                mp.setattr(ModelRuntime, "pick", broken)
                for _ in range(2):  # twice: a leaked slot would make the second one queue, then time out
                    try:
                        await call()
                    except RuntimeError:
                        pass
                    assert adm.in_flight == 0 and adm.waiting == 0
            task = asyncio.ensure_future(call())
            for _ in range(100):
                await asyncio.sleep(0.02)
                if adm.in_flight:
                    break
            assert adm.in_flight == 1  # admitted and waiting on the upstream
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert adm.in_flight == 0 and adm.waiting == 0
        finally:
            await gw.shutdown()
            hang.close()

    asyncio.run(scenario())


def test_a_started_gateway_keeps_its_start_up_heap_out_of_later_collections():
    """One full collection of `argosy serve` mid-serving took 290-360 ms on the test machine: a pause for
    every stream. Started means frozen (argosy/startup_heap.py)."""
    import asyncio
    import gc

    from argosy.config import parse_fleet
    from argosy.gateway.app import Gateway

    async def scenario() -> None:
        gw = Gateway(parse_fleet({"models": [{"name": "m", "upstreams": ["http://127.0.0.1:9"]}]}, "test"))
        messages = [{"type": "lifespan.shutdown"}, {"type": "lifespan.startup"}]
        sent: list[str] = []
        frozen: list[int] = []

        async def receive() -> dict:
            return messages.pop()

        async def send(m: dict) -> None:
            sent.append(m["type"])
            if m["type"] == "lifespan.startup.complete":
                frozen.append(gc.get_freeze_count())

        await gw({"type": "lifespan"}, receive, send)
        assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
        assert frozen[0] > 10_000, frozen

    gc.unfreeze()
    try:
        asyncio.run(scenario())
    finally:
        gc.unfreeze()


def test_one_model_is_retrieved_as_openai_clients_ask(gateway):
    """`client.models.retrieve(name)` is GET /v1/models/{name}: it was a 404 "no route" at the gateway
    (the replicas serve it)."""
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0) as client:
        m = client.models.retrieve("m")
        assert m.id == "m" and m.object == "model"
        with pytest.raises(openai.NotFoundError) as info:
            client.models.retrieve("nope")
        assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"


def test_a_websocket_upgrade_is_refused_not_a_server_error(gateway):
    """An `Upgrade: websocket` request (to any path) was a 500 and an error line in the gateway's log."""
    headers = {"connection": "Upgrade", "upgrade": "websocket", "sec-websocket-version": "13",
               "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ=="}
    for _ in range(2):
        r = httpx.get(gateway.url + "/v1/models", headers=headers, timeout=10)
        assert r.status_code == 403, (r.status_code, r.text)
    assert post(gateway, model="m", prompt="hi", max_tokens=2).status_code == 200
