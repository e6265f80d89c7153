"""The gateway in front of real Argosy replicas (a tiny random-weight model) and a second kind of
upstream (tests/gateway_fixtures.py), through the official openai client."""

import concurrent.futures as cf

import httpx
import openai
import pytest

from tests.gateway_fixtures import start_gateway, start_upstream
from tests.server_fixtures import MODEL_NAME, ServerProcess, metric


@pytest.fixture(scope="module")
def replicas(tiny_llama):
    started = []
    try:
        for _ in range(2):
            started.append(ServerProcess(tiny_llama))
        yield started
    finally:
        for s in started:
            s.stop()


def served(gw):
    up = httpx.get(gw.url + "/admin/upstreams").json()["models"]
    return {u["url"]: u["served"] for m in up.values() for rev in m.values() for u in rev}


def test_argosy_replicas_and_another_upstream_behind_one_gateway(replicas):
    other = start_upstream("other")
    gw = None
    try:
        urls = [r.url for r in replicas]
        gw = start_gateway({"gateway": {"health_interval_s": 0.5}, "models": [
            {"name": MODEL_NAME, "upstreams": urls, "routing": {"policy": "round_robin"}},
            {"name": "legacy", "upstreams": [other.url]}]})
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)
        for _ in range(2):
            r = c.completions.create(model=MODEL_NAME, prompt="Hello there", max_tokens=4, temperature=0)
            assert r.usage.completion_tokens == 4
        chunks = list(c.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=4, stream=True, stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens == 4
        assert all(served(gw)[u] >= 1 for u in urls)
        assert c.completions.create(model="legacy", prompt="x", max_tokens=2).system_fingerprint == "other"
    finally:
        if gw:
            gw.stop()
        other.stop()


def test_prefix_policy_lands_on_the_replica_that_cached_the_prompt(replicas):
    gw = None
    try:
        gw = start_gateway({"models": [{"name": MODEL_NAME, "upstreams": [r.url for r in replicas],
                                        "routing": {"policy": "prefix"}}]})
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)
        system = "You are a careful assistant for tenant Zeta. Always answer briefly and politely. " * 6
        before = [metric(r.metrics(), "vllm:prefix_cache_hits_total") for r in replicas]
        for i in range(4):
            c.completions.create(model=MODEL_NAME, prompt=system + f"Question {i}?", max_tokens=2)
        after = [metric(r.metrics(), "vllm:prefix_cache_hits_total") for r in replicas]
        gained = [a - b for a, b in zip(after, before, strict=True)]
        assert sorted(gained)[0] == 0 and sorted(gained)[1] > 0, gained  # all hits on one replica
        counts = sorted(served(gw).values())
        assert counts == [0, 4]
    finally:
        if gw:
            gw.stop()


def test_replica_killed_under_load_every_request_answered_or_refused(tiny_llama):
    reps = [ServerProcess(tiny_llama) for _ in range(2)]
    gw = None
    try:
        gw = start_gateway({"gateway": {"health_interval_s": 0.3, "eject_after_failures": 1},
                            "models": [{"name": MODEL_NAME, "upstreams": [r.url for r in reps]}]})

        def one(i):
            r = httpx.post(gw.url + "/v1/completions", timeout=60, json={
                "model": MODEL_NAME, "prompt": f"count {i}", "max_tokens": 8})
            assert r.status_code in (200, 503), r.text
            if r.status_code == 503:
                assert "retry-after" in r.headers
            return r.status_code

        with cf.ThreadPoolExecutor(4) as ex:
            futs = [ex.submit(one, i) for i in range(24)]
            futs[6].result()
            reps[0].proc.kill()
            codes = [f.result() for f in futs]
        assert codes.count(200) >= 20, codes
        assert [one(i) for i in range(4)] == [200] * 4  # the survivor takes everything
    finally:
        if gw:
            gw.stop()
        for r in reps:
            r.stop()


def test_tokenize_and_detokenize_reach_a_replica_through_the_gateway(replicas):
    """vLLM's tokenizer routes, through the gateway as on the replica itself: a key may use them (counted as
    requests, billing no tokens), `model` may be left out with one model, bad bodies are named."""
    from argosy.gateway.keys import new_key
    from tests.gateway_fixtures import pepper_for_tests

    key, key_hash = new_key(pepper_for_tests())
    admin_key, admin_hash = new_key(pepper_for_tests())
    gw = None
    try:
        gw = start_gateway({"keys": [{"name": "team", "hash": key_hash, "tpm": 1000}], "admin_key_hash": admin_hash,
                            "models": [{"name": MODEL_NAME, "upstreams": [r.url for r in replicas],
                                        "routing": {"policy": "prefix"}}]})
        auth = {"authorization": f"Bearer {key}"}
        prompt = {"model": MODEL_NAME, "prompt": "Hello there, how are you?"}
        own = httpx.post(replicas[0].url + "/tokenize", json=prompt, timeout=30).json()
        assert httpx.post(gw.url + "/tokenize", json=prompt, timeout=30).status_code == 401  # keys apply
        via = httpx.post(gw.url + "/tokenize", json=prompt, headers=auth, timeout=30)
        assert via.status_code == 200, via.text
        assert via.json()["tokens"] == own["tokens"] and via.json()["count"] == own["count"] > 0
        unnamed = httpx.post(gw.url + "/tokenize", json={"prompt": prompt["prompt"], "stream": True}, headers=auth,
                             timeout=30)  # no model named (the fleet's one); `stream` means nothing here
        assert unnamed.status_code == 200 and unnamed.json()["tokens"] == own["tokens"]
        text = httpx.post(gw.url + "/detokenize", json={"model": MODEL_NAME, "tokens": own["tokens"]}, headers=auth,
                          timeout=30)
        assert text.status_code == 200
        assert text.json() == httpx.post(replicas[1].url + "/detokenize", json={"tokens": own["tokens"]},
                                         timeout=30).json()
        for path, body, param in (("/tokenize", {"model": MODEL_NAME, "prompt": 5}, "prompt"),
                                  ("/detokenize", {"model": MODEL_NAME, "tokens": ["a"]}, "tokens"),
                                  ("/detokenize", {"model": MODEL_NAME, "tokens": [-1]}, "tokens"),
                                  ("/tokenize", {"model": MODEL_NAME, "messages": []}, "messages")):
            bad = httpx.post(gw.url + path, json=body, headers=auth, timeout=30)
            assert (bad.status_code, bad.json()["error"]["param"]) == (400, param), (path, body, bad.text)
        missing = httpx.post(gw.url + "/tokenize", json={"model": "nope", "prompt": "x"}, headers=auth, timeout=30)
        assert missing.status_code == 404
        assert httpx.get(gw.url + "/tokenize", headers=auth, timeout=30).status_code == 405
        usage = httpx.get(gw.url + "/admin/keys", headers={"authorization": f"Bearer {admin_key}"},
                          timeout=30).json()["keys"][0]["usage"]
        assert usage["requests"] == 3 and usage["input_tokens"] == usage["output_tokens"] == 0, usage
    finally:
        if gw:
            gw.stop()


def test_a_keys_usage_is_the_answers_usage_streamed_or_not(replicas):
    """A key's tokens (and so its spend and budget) came from the gateway's estimate unless it had a tokens-per-minute
    limit: a chat's input billed 11 tokens where the replica's usage said 20 (the chat template's tokens). Now
    from the answer's usage, and a stream's from its usage chunk when the client asked for one."""
    from argosy.gateway.keys import new_key
    from tests.gateway_fixtures import pepper_for_tests

    key, key_hash = new_key(pepper_for_tests())
    admin_key, admin_hash = new_key(pepper_for_tests())
    gw = None
    try:
        gw = start_gateway({"keys": [{"name": "team", "hash": key_hash}], "admin_key_hash": admin_hash,
                            "models": [{"name": MODEL_NAME, "upstreams": [r.url for r in replicas]}]})
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there, friend"}]
        done = c.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=5, temperature=0)
        chunks = list(c.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=6, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        streamed = chunks[-1].usage
        usage = httpx.get(gw.url + "/admin/keys", headers={"authorization": f"Bearer {admin_key}"},
                          timeout=30).json()["keys"][0]["usage"]
        assert usage["input_tokens"] == done.usage.prompt_tokens + streamed.prompt_tokens, (usage, done.usage)
        assert usage["output_tokens"] == done.usage.completion_tokens + streamed.completion_tokens
        assert done.usage.prompt_tokens > len("Be brief.Hello there, friend") / 4 + 2  # the estimate was short
    finally:
        if gw:
            gw.stop()
