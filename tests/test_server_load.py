"""Metrics, client disconnects and overload, against a real server subprocess."""

from __future__ import annotations

import contextlib
import time

import httpx
import openai
import pytest

from tests.server_fixtures import MODEL_NAME, ServerProcess, metric

LONG = {"ignore_eos": True}  # with max_tokens=1500: runs for many seconds unless aborted

SERIES = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_bucket", "vllm:inter_token_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_count",
    "vllm:request_queue_time_seconds_bucket", "vllm:request_queue_time_seconds_count",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
]


@pytest.fixture(scope="module")
def server(tiny_llama):
    with ServerProcess(tiny_llama) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as c:
        yield c


def _wait_for(check, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_metrics_export_every_series_with_the_model_label(server, client):
    text = httpx.get(server.url + "/metrics").text
    for name in SERIES:
        assert f'{name}{{' in text, name
    assert f'model_name="{MODEL_NAME}"' in text
    for reason in ("stop", "length", "abort"):
        assert f'finished_reason="{reason}"' in text
    assert 'vllm:time_to_first_token_seconds_bucket{le="0.001",model_name=' in text  # vLLM's buckets
    assert 'vllm:e2e_request_latency_seconds_bucket{le="7680.0",model_name=' in text


def test_metrics_count_what_the_requests_did(server, client):
    prompt = "Rivers carry water from the mountains to the sea. " * 4  # several full KV blocks
    before = server.metrics()
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=9, extra_body=LONG)
    client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=9, extra_body=LONG)  # hits the cache
    after = server.metrics()

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("vllm:prompt_tokens_total") == 2 * r.usage.prompt_tokens
    assert delta("vllm:generation_tokens_total") == 2 * 9
    assert delta("vllm:request_success_total", finished_reason="length") == 2
    for histogram in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        assert delta(f"vllm:{histogram}_seconds_count") == 2
    assert delta("vllm:inter_token_latency_seconds_count") == 2 * 8
    assert delta("vllm:prefix_cache_queries_total") >= 2 * r.usage.prompt_tokens - 1
    assert delta("vllm:prefix_cache_hits_total") >= 16  # the second prompt found at least one block
    assert metric(after, "vllm:num_requests_running") == 0


def test_disconnect_mid_stream_frees_the_kv_blocks(server, client):
    before = server.metrics()
    assert metric(before, "vllm:num_requests_running") == 0
    stream = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=1500, stream=True,
                                       extra_body=LONG)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    running = server.metrics()
    assert metric(running, "vllm:num_requests_running") == 1
    assert metric(running, "vllm:kv_cache_usage_perc") > metric(before, "vllm:kv_cache_usage_perc")
    stream.close()  # the client goes away mid-stream

    def freed() -> bool:
        now = server.metrics()
        return (metric(now, "vllm:num_requests_running") == 0
                and metric(now, "vllm:kv_cache_usage_perc") == metric(before, "vllm:kv_cache_usage_perc")
                and metric(now, "vllm:request_success_total", finished_reason="abort")
                == metric(before, "vllm:request_success_total", finished_reason="abort") + 1)

    _wait_for(freed)


def test_cancelled_non_streaming_request_is_aborted(server, client):
    before = server.metrics()
    with pytest.raises(openai.APITimeoutError):
        # 2000 tokens take the tiny model well over the client's 0.5 s, however fast the engine gets.
        client.with_options(timeout=0.5).chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=2000, extra_body=LONG)
    aborts = metric(before, "vllm:request_success_total", finished_reason="abort")
    _wait_for(lambda: metric(server.metrics(), "vllm:request_success_total", finished_reason="abort") == aborts + 1)
    _wait_for(lambda: metric(server.metrics(), "vllm:kv_cache_usage_perc")
              == metric(before, "vllm:kv_cache_usage_perc"))
    r = client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2, extra_body=LONG)
    assert r.usage.completion_tokens == 2


def test_overload_answers_503_with_retry_after(tiny_llama):
    with ServerProcess(tiny_llama, "--max-num-seqs", "1", "--max-queue", "2") as server, \
            openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client, \
            httpx.Client(base_url=server.base_url, timeout=30) as http, contextlib.ExitStack() as open_streams:
        running = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=1500, stream=True,
                                            extra_body=LONG)
        open_streams.callback(running.close)
        next(iter(running))  # it runs: the only slot is taken
        body = {"prompt": "Hello", "max_tokens": 4, "stream": True}
        for _ in range(2):  # these two wait in the queue, streams open
            waiting = open_streams.enter_context(http.stream("POST", "/completions", json=body))
            assert waiting.status_code == 200
        # The gauge reads the engine's stats, a snapshot it takes every 20 ms while busy: it may lag the adds.
        _wait_for(lambda: metric(server.metrics(), "vllm:num_requests_waiting") == 2)

        refused = http.post("/completions", json={"prompt": "Hello", "max_tokens": 4})
        assert refused.status_code == 503
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "overloaded"
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}])
        assert info.value.status_code == 503

        open_streams.close()  # every client leaves: the queue empties
        _wait_for(lambda: metric(server.metrics(), "vllm:num_requests_running") == 0)
        r = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=3, extra_body=LONG)
        assert r.usage.completion_tokens == 3


def _random_words(n: int, seed: int = 0) -> str:
    import random

    rng = random.Random(seed)
    return " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(4, 10)))
                    for _ in range(n))


def test_a_prompt_longer_than_the_context_could_hold_is_refused_untokenized(server, client):
    """Before, the engine thread tokenized it in full between steps (a 7.5 MB prompt: 5 s) to say it was
    too long; now its length in characters says so."""
    for make in (lambda text: client.completions.create(model=MODEL_NAME, prompt=text, max_tokens=1),
                 lambda text: client.chat.completions.create(model=MODEL_NAME, max_tokens=1,
                                                             messages=[{"role": "user", "content": text}])):
        with pytest.raises(openai.BadRequestError, match="characters, more than this model's context of"):
            make(_random_words(200_000))
    assert client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=2).choices[0].text is not None


def test_a_long_prompt_is_tokenized_beside_the_engine_not_on_its_thread(tmp_path):
    """`tokenizers` holds the GIL in `encode`: on the engine thread (or the event loop) a 3 MB prompt held
    every other request and stream for the seconds it took. It is tokenized in a worker thread now, without
    the GIL, so a short completion sent meanwhile ends first. (A 256k-token context, so that the prompt is
    within what its characters could hold, and is tokenized before it is found too long.)"""
    import asyncio

    from argosy.engine.random_model import make_random_model

    model = make_random_model(tmp_path / "long", arch="llama", init_std=0.2, max_position_embeddings=262_144)
    body = {"model": MODEL_NAME, "prompt": _random_words(400_000, seed=1), "max_tokens": 1}  # about 3 MB

    async def race(url: str) -> list[str]:
        done: list[str] = []
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            async def long() -> None:
                r = await c.post("/v1/completions", json=body)
                assert r.status_code == 400 and "tokens, but this model's context is 262144" in r.text
                done.append("long prompt")

            async def short() -> None:
                await asyncio.sleep(0.3)  # the long prompt is being tokenized by then (about 2 s)
                r = await c.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1})
                assert r.status_code == 200
                done.append("short")

            await asyncio.gather(long(), short())
        return done

    async def flood(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(5)))

    with ServerProcess(str(model), "--max-queue", "2") as server:
        assert asyncio.run(race(server.url)) == ["short", "long prompt"]
        # Prompts being tokenized count as waiting requests: past --max-queue, a 503 with Retry-After.
        answers = asyncio.run(flood(server.url))
        statuses = sorted(r.status_code for r in answers)
        assert statuses.count(503) >= 3 and set(statuses) == {400, 503}, statuses
        assert all(r.headers.get("retry-after") for r in answers if r.status_code == 503)
        assert client_ok(server)


def client_ok(server) -> bool:
    r = httpx.post(server.base_url + "/completions", json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2})
    return r.status_code == 200


def test_more_prompts_than_the_queue_admits_is_a_400_not_a_503(tiny_llama):
    """A request of more prompts than --max-queue can never be admitted, however idle the server: it was a 503
    "overloaded; retry later", which a gateway counts as its replica failing: a few such requests ejected
    every replica of the model, and the model answered 503 to everyone."""
    with ServerProcess(tiny_llama, "--max-queue", "2") as server, \
            httpx.Client(base_url=server.base_url, timeout=30) as http:
        r = http.post("/completions", json={"model": MODEL_NAME, "prompt": ["a", "b", "c"], "max_tokens": 1})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "prompt" and err["code"] == "too_many_prompts" and "--max-queue" in err["message"]
        r = http.post("/completions", json={"model": MODEL_NAME, "prompt": ["a", "b"], "max_tokens": 1})
        assert r.status_code == 200 and len(r.json()["choices"]) == 2
        assert metric(server.metrics(), "vllm:num_requests_waiting") == 0
        # Each of a prompt's n completions is a sequence the engine queues: 2 prompts with n=128 were 256 waiting
        # sequences behind a --max-queue of 2, and every other client got 503 until they were done.
        r = http.post("/completions", json={"model": MODEL_NAME, "prompt": ["a", "b"], "n": 2, "max_tokens": 1})
        err = r.json()["error"]
        assert (r.status_code, err["param"], err["code"]) == (400, "n", "too_many_prompts"), r.text
        assert "4 sequences (2 prompts x n=2)" in err["message"]
        r = http.post("/chat/completions", json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "a"}],
                                                 "n": 3, "max_tokens": 1})
        assert r.status_code == 400 and "3 sequences (1 prompt x n=3)" in r.json()["error"]["message"], r.text
        r = http.post("/chat/completions", json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "a"}],
                                                 "n": 2, "max_tokens": 1})
        assert r.status_code == 200 and len(r.json()["choices"]) == 2
        assert metric(server.metrics(), "vllm:num_requests_waiting") == 0
