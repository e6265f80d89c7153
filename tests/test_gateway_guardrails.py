"""Guardrails, traffic split and shadow mirroring through a real gateway."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import openai
import pytest

from tests.gateway_fixtures import start_gateway, start_upstream


def chat_stream(url, model, content):
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=30, json={
            "model": model, "stream": True, "messages": [{"role": "user", "content": content}]}) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    body = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in body if c.get("choices"))
    return text, body


@pytest.fixture(scope="module")
def moderation():
    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            text = json.loads(self.rfile.read(int(self.headers["content-length"])))["input"]
            out = json.dumps({"results": [{"flagged": "kill" in text}]}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/moderate"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def guarded(moderation):
    up = start_upstream("echo", token_delay=0.005)
    gw = None
    try:
        up.control(echo=True)
        gw = start_gateway({"models": [
            {"name": "in", "upstreams": [up.url], "guardrails": {"input": [
                {"pii": "redact"}, {"blocklist": ["forbidden phrase"]}, {"max_prompt_tokens": 50},
                {"moderation_url": moderation}]}},
            {"name": "out", "upstreams": [up.url], "guardrails": {"stream_window_chars": 16, "output": [
                {"blocklist": ["secret plan"]}, {"pii": "redact"}]}},
        ]})
        yield gw, up
    finally:
        if gw:
            gw.stop()
        up.stop()


def test_input_pii_redacted_before_the_upstream_sees_it(guarded):
    gw, _ = guarded
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)
    r = c.chat.completions.create(model="in", messages=[{"role": "user", "content": "mail me at bob@example.com"}])
    assert "bob@example.com" not in r.choices[0].message.content and "[EMAIL]" in r.choices[0].message.content


@pytest.mark.parametrize("content,code", [("a forbidden phrase here", "content_filter"),
                                          ("how to kill a process", "content_filter"),
                                          ("word " * 300, "prompt_too_long")])
def test_input_blocks(guarded, content, code):
    gw, _ = guarded
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "in", "messages": [
        {"role": "user", "content": content}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == code


def test_stream_output_guardrail_catches_a_match_split_across_chunks(guarded):
    gw, _ = guarded
    # the echo upstream streams word by word: "secret" and "plan" arrive in different chunks
    text, body = chat_stream(gw.url, "out", "ok so the secret plan is this")
    assert "secret plan" not in text and "secret" not in text
    assert "error" in body[-1] and body[-1]["error"]["code"] == "content_filter"


def test_stream_output_pii_redacted_and_rest_intact(guarded):
    gw, _ = guarded
    text, _ = chat_stream(gw.url, "out", "contact alice@example.org or 4111 1111 1111 1111 please thanks")
    assert text == "<user>contact [EMAIL] or [CREDIT_CARD] please thanks"
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "out", "messages": [
        {"role": "user", "content": "the secret plan"}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "content_filter"


def test_traffic_split_by_weight_and_sticky_sessions():
    v1, v2 = start_upstream("v1"), start_upstream("v2")
    gw = None
    try:
        gw = start_gateway({"models": [{"name": "m", "revision": "v1", "upstreams": [v1.url], "traffic": [
            {"revision": "v1", "weight": 80}, {"revision": "v2", "weight": 20, "upstreams": [v2.url]}]}]})
        c = httpx.Client(base_url=gw.url)
        got = [c.post("/v1/completions", json={"model": "m", "prompt": "x"}).json()["system_fingerprint"]
               for _ in range(200)]
        assert 20 <= got.count("v2") <= 60, got.count("v2")
        sticky = {c.post("/v1/completions", headers={"x-session-id": "s1"}, json={"model": "m", "prompt": "x"})
                  .json()["system_fingerprint"] for _ in range(10)}
        assert len(sticky) == 1
        assert 'route="v2"' in c.get("/metrics").text
    finally:
        if gw:
            gw.stop()
        v1.stop()
        v2.stop()


def test_shadow_never_slows_the_user_and_records_agreement():
    main, shadow = start_upstream("main"), start_upstream("shadow", ttft=2.0)
    gw = None
    try:
        gw = start_gateway({"models": [{"name": "m", "upstreams": [main.url],
                                        "shadow": {"revision": "v2", "sample": 1.0, "upstreams": [shadow.url]}}]})
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)
        for i in range(4):
            t = time.monotonic()
            if i % 2:
                r = c.completions.create(model="m", prompt="hello", max_tokens=4)
                assert r.system_fingerprint == "main"
            else:
                assert "".join(ch.choices[0].text for ch in c.completions.create(
                    model="m", prompt="hello", max_tokens=4, stream=True) if ch.choices) == "w0 w1 w2 w3"
            assert time.monotonic() - t < 1.0  # the 2 s shadow is never waited for
        deadline = time.monotonic() + 10
        while True:
            m = httpx.get(gw.url + "/metrics").text
            if 'argosy_gateway_shadow_requests_total{model="m",outcome="agree"} 4.0' in m:
                break
            assert time.monotonic() < deadline, [ln for ln in m.splitlines() if "shadow" in ln]
            time.sleep(0.2)
        assert shadow.stats()["requests"] == 4
        assert "argosy_gateway_shadow_e2e_seconds_count" in m
    finally:
        if gw:
            gw.stop()
        main.stop()
        shadow.stop()
