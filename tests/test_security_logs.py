"""Security checks (issue 15): at the most verbose log level (debug, so every level), neither the gateway
nor the replica writes a prompt, an output, an API key or the replica secret in any log line, for
answered, streamed, refused and failed requests alike; with `log_content` the gateway does log the
content (so this test does see what the logs hold)."""

from __future__ import annotations

import secrets

import httpx
import pytest

from argosy.gateway.keys import new_key
from tests.gateway_fixtures import pepper_for_tests, start_gateway
from tests.server_fixtures import MODEL_NAME, ServerProcess

pytestmark = pytest.mark.timeout(180)
CANARY = "canary-prompt-7f3a9c"


def exercise(url: str, key: str) -> list[str]:
    """Answered, streamed, chat, refused (400) and unauthorized requests carrying the canary; the outputs."""
    auth = {"authorization": f"Bearer {key}"}
    outputs = []
    for body in ({"prompt": f"{CANARY} tell me", "max_tokens": 12, "ignore_eos": True},
                 {"prompt": f"{CANARY} stream", "max_tokens": 12, "ignore_eos": True, "stream": True}):
        r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, **body}, headers=auth, timeout=60)
        assert r.status_code == 200
        if not body.get("stream"):
            outputs.append(r.json()["choices"][0]["text"])
    r = httpx.post(url + "/v1/chat/completions", headers=auth, timeout=60, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": f"{CANARY} chat"}], "max_tokens": 12})
    assert r.status_code == 200
    outputs.append(r.json()["choices"][0]["message"]["content"])
    bad = httpx.post(url + "/v1/completions", headers=auth, timeout=60,
                     json={"model": MODEL_NAME, "prompt": f"{CANARY} bad", "max_tokens": -1, "temperature": "hot"})
    assert bad.status_code == 400
    assert httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": CANARY},
                      headers={"authorization": "Bearer sk-argosy-00000000-wrong"}, timeout=60).status_code == 401
    return [o for o in outputs if len(o.strip()) >= 8]


SECRET = secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def replica(tiny_llama):
    r = ServerProcess(tiny_llama, "--log-level", "debug", env={"ARGOSY_API_KEY": SECRET})
    yield r
    r.stop()


@pytest.mark.parametrize("log_content", [False, True])
def test_no_content_or_secret_in_any_log_line(replica, log_content):
    secret = SECRET
    key, key_hash = new_key(pepper_for_tests())
    gw = start_gateway({"gateway": {"log_content": log_content}, "keys": [{"name": "k", "hash": key_hash}],
                        "models": [{"name": MODEL_NAME, "upstreams": [replica.url]}]},
                       "--log-level", "debug", "--log-requests", env={"ARGOSY_UPSTREAM_API_KEY": secret})
    try:
        outputs = exercise(gw.url, key)
        replica_log = replica.output()
    finally:
        gw.popen.terminate()
        _, gateway_log = gw.popen.communicate(timeout=30)
    assert gateway_log.count("\n") > 3 and replica_log.count("\n") > 1  # the logs are there to search
    for name, log in (("gateway", gateway_log), ("replica", replica_log)):
        assert key not in log and key.split("-", 3)[3] not in log, f"the API key is in the {name}'s log"
        assert secret not in log, f"the replica secret is in the {name}'s log"
    assert CANARY not in replica_log and not any(o in replica_log for o in outputs)
    if log_content:
        assert CANARY in gateway_log  # opted in: the content is logged (and this test would see it)
    else:
        assert CANARY not in gateway_log, [ln for ln in gateway_log.splitlines() if CANARY in ln][:3]
        assert not any(o in gateway_log for o in outputs)
