"""Health and failover through a real gateway: kills, injected failures, ejection and recovery."""

import concurrent.futures as cf
import json
import time

import httpx
import pytest

from tests.gateway_fixtures import start_gateway, start_upstream

GW = {"health_interval_s": 0.3, "eject_after_failures": 2, "eject_for_s": 1.0, "max_retries": 2}


def states(gw, model="m"):
    up = httpx.get(gw.url + "/admin/upstreams").json()["models"][model]
    return {u["url"]: u["state"] for rev in up.values() for u in rev}


def stream_request(url, model="m"):
    """Returns ('ok', text) / ('error', code) / ('refused', status) — anything else is a lost request."""
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=30, json={
            "model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
        if r.status_code != 200:
            r.read()
            assert r.status_code == 503 and "retry-after" in r.headers, (r.status_code, r.text)
            return "refused", r.status_code
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events
    last = json.loads(events[-2]) if len(events) > 1 else {}
    if "error" in last:
        return "error", last["error"]["code"]
    return "ok", "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])


def plain_request(url, model="m"):
    r = httpx.post(url + "/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 4}, timeout=30)
    if r.status_code == 200:
        return "ok", r.json()["system_fingerprint"]
    assert r.status_code == 503 and "retry-after" in r.headers, (r.status_code, r.text)
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    return "refused", r.status_code


@pytest.fixture
def trio():
    ups = [start_upstream(f"u{i}", ttft=0.02, token_delay=0.02) for i in range(3)]
    gw = None
    try:
        gw = start_gateway({"gateway": GW, "models": [
            {"name": "m", "upstreams": [u.url for u in ups], "routing": {"policy": "least_load"}},
            {"name": "empty"}]})
        yield gw, ups
    finally:
        if gw:
            gw.stop()
        for u in ups:
            u.stop()


def test_upstream_killed_mid_test_loses_no_request(trio):
    gw, ups = trio
    results = []
    with cf.ThreadPoolExecutor(8) as ex:
        futs = []
        for i in range(48):
            futs.append(ex.submit(stream_request if i % 2 else plain_request, gw.url))
            if i == 16:
                ups[1].kill()
            time.sleep(0.02)
        results = [f.result() for f in futs]  # every future returns: nothing hung, nothing reset
    kinds = [r[0] for r in results]
    assert kinds.count("ok") >= 40, results  # the rest went to the survivors
    assert all(r[1] == "upstream_failed_mid_stream" for r in results if r[0] == "error")
    assert states(gw)[ups[1].url] == "open"
    # once ejected, nothing more goes to it: all answered by the survivors
    assert all(plain_request(gw.url)[0] == "ok" for _ in range(10))


def test_failures_eject_then_recover(trio):
    gw, ups = trio
    ups[0].control(fail_count=1000, fail_status=500)
    got = [plain_request(gw.url) for _ in range(12)]
    assert all(k == "ok" and who != "u0" for k, who in got), got  # retried on the others, never seen failing
    assert states(gw)[ups[0].url] in ("open", "half_open")  # ejected (or being probed)
    ups[0].control(fail_count=0)
    deadline = time.monotonic() + 5
    while states(gw)[ups[0].url] != "closed":  # after the cooldown a request probes it, and succeeds
        assert time.monotonic() < deadline, "did not recover"
        assert plain_request(gw.url)[0] == "ok"
        time.sleep(0.1)
    assert "u0" in {plain_request(gw.url)[1] for _ in range(9)}


def test_hang_up_before_first_byte_is_retried(trio):
    gw, ups = trio
    for u in ups[:2]:
        u.control(fail_count=1, fail_status=-1)  # close the connection without answering
    assert all(stream_request(gw.url)[0] == "ok" for _ in range(4))


def test_started_stream_ends_with_error_event_and_done():
    up = start_upstream("solo", token_delay=0.01)
    gw = None
    try:
        gw = start_gateway({"gateway": GW, "models": [{"name": "m", "upstreams": [up.url]}]})
        up.control(die_after_chunks=3)
        kind, code = stream_request(gw.url)
        assert (kind, code) == ("error", "upstream_failed_mid_stream")
        assert stream_request(gw.url)[0] == "ok"  # not ejected by one failure (threshold 2)
    finally:
        if gw:
            gw.stop()
        up.stop()


def test_no_live_upstream_is_a_retryable_503_not_404(trio):
    gw, ups = trio
    assert plain_request(gw.url, "empty") == ("refused", 503)
    for u in ups:
        u.kill()
    got = [plain_request(gw.url) for _ in range(5)]
    assert all(k == "refused" for k, _ in got)


def test_a_busy_upstream_is_not_ejected_a_broken_one_is():
    """A replica's 503 with Retry-After (its queue is full) was counted as a failure: a burst of large requests
    (prompt arrays) ejected every replica of the model, and everyone got 503 no_upstream for the ejection."""
    up = start_upstream("u")
    gw = None
    try:
        gw = start_gateway({"gateway": {**GW, "eject_for_s": 60, "health_interval_s": 30}, "models": [
            {"name": "m", "upstreams": [up.url]}]})
        up.control(fail_status=503, fail_retry_after=1, fail_count=4)
        assert [plain_request(gw.url)[0] for _ in range(3)] == ["refused"] * 3
        r = httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 4}, timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"]  # said as busy, not as "no live upstream"
        assert f"model 'm': its upstreams are busy (503 (busy) from {up.url})" in r.json()["error"]["message"]
        assert states(gw) == {up.url: "closed"}
        assert plain_request(gw.url) == ("ok", "u")
        up.control(fail_status=503, fail_retry_after=0, fail_count=4)  # no Retry-After: broken, ejected
        for _ in range(2):
            plain_request(gw.url)
        assert states(gw) == {up.url: "open"}
    finally:
        if gw:
            gw.stop()
        up.stop()
