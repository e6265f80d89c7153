"""The OpenAI-compatible API of `python -m argosy.server`, through the official openai client."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from argosy.engine.sampling_params import SamplingParams
from tests.server_fixtures import MODEL_NAME, ServerProcess

PROMPTS = ["The quick brown fox", "Once upon a time", "def fibonacci(n):", "Rivers carry water"]
NO_EOS = {"ignore_eos": True}  # random weights may sample EOS at any step; these tests want exact lengths


@pytest.fixture(scope="module")
def server(tiny_llama):
    with ServerProcess(tiny_llama, "--max-model-len", "256") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def offline(tiny_llama):
    """Greedy outputs of the offline engine: what the server must reproduce."""
    from argosy import LLM

    llm = LLM(tiny_llama, kv_cache_memory_gib=0.02)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    return {p: o.outputs[0].text for p, o in zip(PROMPTS, outs, strict=True)}


def _count_tokens(server: ServerProcess, **body) -> int:
    return httpx.post(server.url + "/tokenize", json=body, timeout=10).json()["count"]


def test_startup_lines_and_probes(server):
    out = server.output()
    assert f"listening on {server.url}" in out and "ready" in out
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/ready").status_code == 200


def test_models(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME


def test_completion_matches_offline_engine_and_counts_usage(server, client, offline):
    for prompt in PROMPTS:
        r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0,
                                      extra_body=NO_EOS)
        assert r.object == "text_completion" and r.model == MODEL_NAME
        assert r.choices[0].text == offline[prompt]
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == 12
        assert r.usage.prompt_tokens == _count_tokens(server, prompt=prompt)
        assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_streaming_completion_concatenates_to_the_same_text(client, offline):
    prompt = PROMPTS[0]
    stream = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body=NO_EOS)
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == offline[prompt]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])


def test_default_max_tokens_is_16(client):
    r = client.completions.create(model=MODEL_NAME, prompt="Hello", temperature=0, extra_body=NO_EOS)
    assert r.usage.completion_tokens == 16


def test_prompt_forms_and_choice_indexes(server, client):
    ids = httpx.post(server.url + "/tokenize", json={"prompt": PROMPTS[1]}).json()["tokens"]
    by_text = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=6, temperature=0,
                                        extra_body=NO_EOS)
    by_ids = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=6, temperature=0, extra_body=NO_EOS)
    assert by_ids.choices[0].text == by_text.choices[0].text
    many = client.completions.create(model=MODEL_NAME, prompt=[ids, ids[:-1]], n=2, max_tokens=5, temperature=1.0,
                                     seed=7, extra_body=NO_EOS)
    assert sorted(c.index for c in many.choices) == [0, 1, 2, 3]
    assert many.usage.prompt_tokens == 2 * len(ids) - 1  # each prompt once, not n times
    assert many.usage.completion_tokens == 4 * 5
    strings = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[:3], max_tokens=4, temperature=0,
                                        extra_body=NO_EOS)
    assert [c.index for c in strings.choices] == [0, 1, 2]


def test_n_streams_every_choice(client):
    stream = client.completions.create(model=MODEL_NAME, prompt="Hello", n=3, max_tokens=8, temperature=1.0, seed=1,
                                       stream=True, extra_body=NO_EOS)
    texts, finishes = {}, {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    whole = client.completions.create(model=MODEL_NAME, prompt="Hello", n=3, max_tokens=8, temperature=1.0, seed=1,
                                      extra_body=NO_EOS)
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert texts == {c.index: c.text for c in whole.choices}
    assert len(set(texts.values())) > 1  # each completion samples its own stream (seed + index)


def test_seed_reproduces(client):
    def sample(seed: int) -> str:
        return client.completions.create(model=MODEL_NAME, prompt="Once", max_tokens=16, temperature=1.0, seed=seed,
                                         extra_body=NO_EOS).choices[0].text

    assert sample(123) == sample(123)
    assert sample(123) != sample(124)


def test_stop_strings(client, offline):
    full = offline[PROMPTS[2]]
    stop = full[5:8]
    expected = full[: full.index(stop)]
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[2], max_tokens=12, temperature=0, stop=[stop],
                                  extra_body=NO_EOS)
    assert r.choices[0].text == expected
    assert r.choices[0].finish_reason == "stop"
    kept = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[2], max_tokens=12, temperature=0, stop=stop,
                                     stream=True, extra_body={**NO_EOS, "include_stop_str_in_output": True})
    assert "".join(c.choices[0].text for c in kept) == expected + stop


def test_echo_and_logprobs(client, offline):
    prompt = PROMPTS[3]
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0, echo=True,
                                  extra_body=NO_EOS)
    assert r.choices[0].text == prompt + offline[prompt]
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0, logprobs=2,
                                  extra_body=NO_EOS)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 12
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(12)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob <= 0 and 1 <= len(top) <= 3  # keyed by text: tokens with the same text share a key
        assert logprob == pytest.approx(max(top.values()))  # greedy picks the most likely token
        assert token in top


def test_chat(server, client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_completion_tokens=7, temperature=0,
                                       extra_body=NO_EOS)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7
    assert r.usage.prompt_tokens == _count_tokens(server, messages=messages)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=7, temperature=0,
                                            stream=True, stream_options={"include_usage": True}, extra_body=NO_EOS)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 7 and chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_chat_text_parts_n_and_logprobs(client):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Tell me"}, {"type": "text", "text": "more"}]}]
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=5, temperature=0.8, n=2, seed=3,
                                       logprobs=True, top_logprobs=3, extra_body=NO_EOS)
    assert sorted(c.index for c in r.choices) == [0, 1]
    for choice in r.choices:
        content = choice.logprobs.content
        assert len(content) == 5
        assert "".join(t.token for t in content) == choice.message.content
        assert all(len(t.top_logprobs) == 3 and bytes(t.bytes) == t.token.encode() for t in content)


def test_async_client_concurrent_streams(server, offline):
    asyncio.run(_async_client_checks(server, offline))


async def _async_client_checks(server, offline):
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client:

        async def streamed(prompt: str) -> str:
            stream = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0,
                                                     stream=True, extra_body=NO_EOS)
            return "".join([c.choices[0].text async for c in stream])

        async def whole(prompt: str) -> str:
            r = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0,
                                                extra_body=NO_EOS)
            return r.choices[0].text

        results = await asyncio.gather(*[f(p) for p in PROMPTS for f in (streamed, whole)])
        assert results == [offline[p] for p in PROMPTS for _ in range(2)]
        chat = await client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                                    max_tokens=3, extra_body=NO_EOS)
        assert chat.usage.completion_tokens == 3


def test_tokenize_detokenize(server):
    r = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
    assert r["count"] == len(r["tokens"]) == len(r["token_strs"]) and r["max_model_len"] == 256
    plain = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world", "add_special_tokens": False}).json()
    assert r["tokens"][-plain["count"]:] == plain["tokens"]
    back = httpx.post(server.url + "/detokenize", json={"tokens": plain["tokens"]}).json()
    assert back == {"prompt": "Hello world"}


def test_priority_and_cache_salt_are_accepted(client):
    r = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=2,
                                  extra_body={"priority": 5, "cache_salt": "tenant-a", "top_k": 5, "min_p": 0.05,
                                              "repetition_penalty": 1.1, "min_tokens": 2, "user": "u1"})
    assert r.usage.completion_tokens == 2


def test_logit_bias_forces_a_token_and_bad_biases_are_named(server, client):
    forced = 42
    text = httpx.post(server.url + "/detokenize", json={"tokens": [forced] * 4}).json()["prompt"]
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=4, temperature=0,
                                  logit_bias={str(forced): 100}, extra_body=NO_EOS)
    assert r.choices[0].text == text
    r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                       max_completion_tokens=3, logit_bias={str(forced): 1e300}, extra_body=NO_EOS)
    assert r.choices[0].message.content == httpx.post(server.url + "/detokenize",
                                                      json={"tokens": [forced] * 3}).json()["prompt"]
    flood = {str(i): 1 for i in range(300_000)}  # refused before any loop over it
    for bias, says in (({"100000": 1}, "outside this model's vocabulary"), ({"abc": 1}, "must be token ids"),
                       (flood, "at most 262,144"),
                       ({"1": "up"}, "must be a number"), ([1, 2], "'logit_bias' must be an object")):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2, logit_bias=bias)
        assert says in e.value.message and e.value.body["param"] == "logit_bias"
    with pytest.raises(openai.BadRequestError) as e:  # a stop id no output can hold: said, as a bad bias is
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                       extra_body={"stop_token_ids": [3, 99_999_999]})
    assert "outside this model's vocabulary" in e.value.message and e.value.body["param"] == "stop_token_ids"
    assert client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2).usage.completion_tokens >= 1


def test_echo_with_logprobs_scores_the_prompt_as_lm_evaluation_harness_asks(server, client):
    prompt = PROMPTS[1]
    ids = httpx.post(server.url + "/tokenize", json={"prompt": prompt}).json()["tokens"]
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1, temperature=0, echo=True,
                                  logprobs=1, extra_body=NO_EOS)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and r.choices[0].text.startswith(prompt)
    assert all(v <= 0 for v in lp.token_logprobs[1:]) and lp.text_offset == sorted(lp.text_offset)
    # The same figures as vLLM's prompt_logprobs field, keyed by token id.
    plain = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1, temperature=0,
                                      extra_body={"prompt_logprobs": 0, **NO_EOS})
    by_id = plain.choices[0].model_extra["prompt_logprobs"]
    assert by_id[0] is None and len(by_id) == len(ids) and plain.choices[0].logprobs is None
    assert [by_id[i][str(ids[i])]["logprob"] for i in range(1, len(ids))] == pytest.approx(lp.token_logprobs[1:-1])
    # Streamed: the echoed prompt comes with its logprobs before the first token's.
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=2, temperature=0, echo=True,
                                            logprobs=1, stream=True, extra_body=NO_EOS))
    first = chunks[0].choices[0]
    assert first.text == prompt and first.logprobs.token_logprobs == lp.token_logprobs[:-1]
    with pytest.raises(openai.BadRequestError, match="not available when 'stream' is true"):
        client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1, stream=True,
                                  extra_body={"prompt_logprobs": 1})


def test_continue_final_message_goes_on_with_the_assistants_words(server, client):
    messages = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "General Kenobi"}]
    open_turn = httpx.post(server.url + "/tokenize", json={"messages": messages, "continue_final_message": True,
                                                           "return_token_strs": True}).json()
    closed = httpx.post(server.url + "/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()
    # The same tokens up to the assistant's words, then no end of turn after them.
    assert closed["tokens"][:open_turn["count"]] == open_turn["tokens"] and closed["count"] > open_turn["count"]
    assert "".join(open_turn["token_strs"]).endswith("General Kenobi")
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_completion_tokens=3, temperature=0,
                                       extra_body={"continue_final_message": True, **NO_EOS})
    assert r.usage.prompt_tokens == open_turn["count"] and r.usage.completion_tokens == 3
    for extra, says in (({"continue_final_message": True, "add_generation_prompt": True}, "cannot both be true"),
                        ({"chat_template_kwargs": {"chat_template": "{{ 7 }}"}}, "may not set chat_template")):
        with pytest.raises(openai.BadRequestError, match=says):
            client.chat.completions.create(model=MODEL_NAME, messages=messages, max_completion_tokens=2,
                                           extra_body=extra)


def test_max_tokens_0_with_echo_answers_the_scored_prompt_alone(server, client):
    prompt = PROMPTS[2]
    ids = httpx.post(server.url + "/tokenize", json={"prompt": prompt}).json()["tokens"]
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    choice = r.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length"
    assert len(choice.logprobs.token_logprobs) == len(ids) and choice.logprobs.token_logprobs[0] is None
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    for extra, says in (({"echo": False}, "max_tokens"), ({"echo": True, "stream": True}, "not streamed")):
        with pytest.raises(openai.BadRequestError, match=says):
            client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=0, **extra)


def test_chat_template_kwargs_reach_the_template_beside_the_servers_own_switches():
    from argosy.server.protocol import Fields, chat_template_options

    assert chat_template_options(Fields({"chat_template_kwargs": {"enable_thinking": False}})) == {
        "enable_thinking": False, "add_generation_prompt": True, "continue_final_message": False}
    assert chat_template_options(Fields({"continue_final_message": True})) == {
        "add_generation_prompt": False, "continue_final_message": True}
