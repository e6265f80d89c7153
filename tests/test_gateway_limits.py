"""Admission, priority, API keys and per-key limits under concurrency; limits shared through Redis."""

import concurrent.futures as cf
import time

import httpx
import openai
import pytest

from argosy.gateway.keys import new_key
from tests.gateway_fixtures import pepper_for_tests, start_gateway, start_redis, start_upstream


def post(url, model="m", key=None, headers=None, **body):
    h = {**({"authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    return httpx.post(url + "/v1/completions", headers=h, timeout=30,
                      json={"model": model, "prompt": "hello", "max_tokens": 4, **body})


@pytest.fixture(scope="module")
def slow_up():
    up = start_upstream("slow", ttft=0.6)
    yield up
    up.stop()


def test_admission_bounds_in_flight_and_queue(slow_up):
    gw = start_gateway({"models": [{"name": "m", "upstreams": [slow_up.url],
                                    "admission": {"max_in_flight": 2, "max_queue": 2, "queue_timeout_s": 0.3}}]})
    try:
        slow_up.reset()
        with cf.ThreadPoolExecutor(8) as ex:
            rs = list(ex.map(lambda _: post(gw.url), range(8)))
        codes = sorted(r.status_code for r in rs)
        assert codes.count(200) == 2 and codes.count(503) == 6, codes
        for r in rs:
            if r.status_code == 503:
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["code"] in ("queue_full", "queue_timeout")
        assert {r.json()["error"]["code"] for r in rs if r.status_code == 503} == {"queue_full", "queue_timeout"}
        assert slow_up.stats()["max_in_flight"] <= 2
        m = httpx.get(gw.url + "/metrics").text
        assert 'argosy_gateway_rejections_total{key_class="none",model="m",reason="queue_full"}' in m
    finally:
        gw.stop()


def test_interactive_admitted_before_batch(slow_up):
    gw = start_gateway({"models": [{"name": "m", "upstreams": [slow_up.url],
                                    "admission": {"max_in_flight": 1, "max_queue": 10, "queue_timeout_s": 20}}]})
    try:
        done = []

        def req(tag, hdr):
            post(gw.url, headers=hdr).raise_for_status()
            done.append(tag)

        with cf.ThreadPoolExecutor(4) as ex:
            f0 = ex.submit(req, "first", {})
            time.sleep(0.2)
            fb = ex.submit(req, "batch", {"x-priority": "batch"})
            time.sleep(0.2)
            fi = ex.submit(req, "interactive", {})
            for f in (f0, fb, fi):
                f.result()
        assert done == ["first", "interactive", "batch"]
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def fast_up():
    up = start_upstream("fast")
    yield up
    up.stop()


def test_keys_models_and_admin(fast_up):
    ka, ha = new_key(pepper_for_tests())
    kadm, hadm = new_key(pepper_for_tests())
    gw = start_gateway({"keys": [{"name": "team-a", "hash": ha, "models": ["m"]}], "admin_key_hash": hadm,
                        "models": [{"name": "m", "upstreams": [fast_up.url]},
                                   {"name": "other", "upstreams": [fast_up.url]}]})
    try:
        assert post(gw.url).status_code == 401
        assert post(gw.url, key=ka[:-2] + "zz").status_code == 401
        r = post(gw.url, model="other", key=ka)
        assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key=ka, max_retries=0)
        assert c.completions.create(model="m", prompt="x", max_tokens=2).choices[0].text
        assert httpx.get(gw.url + "/admin/keys").status_code == 401
        assert httpx.get(gw.url + "/admin/keys", headers={"authorization": f"Bearer {ka}"}).status_code == 401
        adm = {"authorization": f"Bearer {kadm}"}
        keys = httpx.get(gw.url + "/admin/keys", headers=adm).json()["keys"]
        assert [k["name"] for k in keys] == ["team-a"] and keys[0]["usage"]["requests"] == 1
        assert "hash" not in keys[0]
        new = httpx.post(gw.url + "/admin/keys", headers=adm, json={"name": "team-b", "models": ["other"]}).json()
        assert post(gw.url, model="other", key=new["key"]).status_code == 200
        assert httpx.delete(gw.url + "/admin/keys/team-b", headers=adm).status_code == 200
        assert post(gw.url, model="other", key=new["key"]).status_code == 401
        # A new key that could not work, or a name taken: said, where they had been made (or garbled)
        for body, param, says in (({"name": "team-c", "models": ["oher"]}, "models", "no model 'oher' in this fleet"),
                                  ({"name": "team-a"}, "name", "a key named 'team-a' exists already")):
            r = httpx.post(gw.url + "/admin/keys", headers=adm, json=body)
            assert (r.status_code, r.json()["error"]["param"]) == (400, param) and says in r.text, r.text
    finally:
        gw.stop()


def test_rpm_and_tpm_under_concurrency(fast_up):
    k1, h1 = new_key(pepper_for_tests())
    k2, h2 = new_key(pepper_for_tests())
    gw = start_gateway({"keys": [{"name": "r", "hash": h1, "rpm": 5}, {"name": "t", "hash": h2, "tpm": 100}],
                        "models": [{"name": "m", "upstreams": [fast_up.url]}]})
    try:
        with cf.ThreadPoolExecutor(12) as ex:
            rs = list(ex.map(lambda _: post(gw.url, key=k1), range(12)))
        codes = [r.status_code for r in rs]
        assert codes.count(200) == 5 and codes.count(429) == 7, codes
        r429 = next(r for r in rs if r.status_code == 429)
        assert 1 <= int(r429.headers["retry-after"]) <= 13 and r429.json()["error"]["code"] == "rate_limit_exceeded"
        assert "(rpm 5)" in r429.json()["error"]["message"]  # the limits the key has ("tpm None" had been there)
        # tpm: the estimate (prompt + max_tokens=60) is reserved, then reconciled to the real usage (~5),
        # so a second request fits although 2 x 61 > 100
        assert post(gw.url, key=k2, max_tokens=60).status_code == 200
        assert post(gw.url, key=k2, max_tokens=60).status_code == 200
    finally:
        gw.stop()


def test_two_gateways_share_one_limit_through_redis(fast_up):
    rp, rurl = start_redis()
    key, h = new_key(pepper_for_tests())
    cfg = {"gateway": {"redis_url": rurl}, "keys": [{"name": "shared", "hash": h, "rpm": 6}],
           "models": [{"name": "m", "upstreams": [fast_up.url]}]}
    g1 = g2 = None
    try:
        g1, g2 = start_gateway(cfg), start_gateway(cfg)
        with cf.ThreadPoolExecutor(10) as ex:
            rs = list(ex.map(lambda i: post((g1, g2)[i % 2].url, key=key), range(20)))
        codes = [r.status_code for r in rs]
        assert codes.count(200) == 6, codes  # the limit holds across gateways, not 6 x 2
        by_gw = [sum(1 for i, r in enumerate(rs) if i % 2 == g and r.status_code == 200) for g in (0, 1)]
        assert sum(by_gw) == 6
    finally:
        for g in (g1, g2):
            if g:
                g.stop()
        rp.terminate()
        rp.wait(10)


def test_two_gateways_share_prefix_index_and_in_flight_through_redis():
    rp, rurl = start_redis()
    ups = [start_upstream(f"u{i}") for i in range(3)]
    cfg = {"gateway": {"redis_url": rurl, "shared_sync_s": 0.05}, "models": [
        {"name": "m", "upstreams": [u.url for u in ups], "routing": {"policy": "prefix"}}]}
    g1 = g2 = None
    try:
        g1, g2 = start_gateway(cfg), start_gateway(cfg)
        tenants = [f"System prompt of tenant {t}, long and shared by its users. " * 10 for t in range(3)]
        first = [post(g1.url, prompt=t + "q0").json()["system_fingerprint"] for t in tenants]
        time.sleep(0.2)
        again = [post(g2.url, prompt=t + "q1").json()["system_fingerprint"] for t in tenants]
        assert again == first  # g2 routes by what g1 sent where
        ups[0].control(ttft=1.5)
        with cf.ThreadPoolExecutor(3) as ex:
            fs = [ex.submit(post, g1.url, prompt=tenants[first.index("u0")] + f"slow {i}") for i in range(3)]
            time.sleep(0.6)
            seen = httpx.get(g2.url + "/admin/upstreams").json()["models"]["m"]["v1"]
            remote = {u["url"]: u["remote_in_flight"] for u in seen}
            assert remote[ups[0].url] == 3  # g2 sees g1's in-flight requests
            for f in fs:
                f.result()
    finally:
        for g in (g1, g2):
            if g:
                g.stop()
        for u in ups:
            u.stop()
        rp.terminate()
        rp.wait(10)


def test_tokens_per_minute_reserve_every_completion_a_request_asks_for(slow_up):
    """n completions for each of several prompts are n x prompts x max_tokens tokens: the reservation counted one
    completion, so a key could ask for 128 x 1,000 of them against a tokens-per-minute limit meant for one."""
    key, key_hash = new_key(pepper_for_tests())
    gw = start_gateway({"keys": [{"name": "t", "hash": key_hash, "tpm": 200}],
                        "models": [{"name": "m", "upstreams": [slow_up.url]}]})
    try:
        with cf.ThreadPoolExecutor(2) as ex:
            big = ex.submit(post, gw.url, key=key, max_tokens=40, n=2, prompt=["hello", "there"])  # 160 reserved
            time.sleep(0.3)  # in flight (the upstream answers after 0.6 s)
            second = post(gw.url, key=key, max_tokens=50)
            assert second.status_code == 429 and second.json()["error"]["code"] == "rate_limit_exceeded"
            assert big.result().status_code == 200
        bad = post(gw.url, key=key, n=0)
        assert (bad.status_code, bad.json()["error"]["param"]) == (400, "n")
        assert post(gw.url, key=key, n="2").json()["error"]["param"] == "n"
        assert post(gw.url, key=key, n=1e300).json()["error"]["param"] == "n"  # no 300-digit estimate
    finally:
        gw.stop()


def test_cors_lets_the_listed_pages_read_answers_and_no_other(fast_up):
    """A browser app calling the gateway with a key needs CORS (vLLM's --allowed-origins): its preflight got a 405
    and its answers carried no Access-Control-Allow-Origin, so the browser let the page read nothing."""
    key, key_hash = new_key(pepper_for_tests())
    page, other = "https://app.example", "https://evil.example"
    gw = start_gateway({"gateway": {"cors_allow_origins": [page]}, "keys": [{"name": "k", "hash": key_hash}],
                        "models": [{"name": "m", "upstreams": [fast_up.url]}]})
    try:
        ask = {"access-control-request-method": "POST", "access-control-request-headers": "authorization, content-type"}
        pre = httpx.options(gw.url + "/v1/chat/completions", headers={"origin": page, **ask}, timeout=10)
        assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == page
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert pre.headers["access-control-allow-headers"] == "authorization, content-type"
        assert httpx.options(gw.url + "/v1/chat/completions", headers={"origin": other, **ask},
                             timeout=10).status_code == 405
        answer = post(gw.url, key=key, headers={"origin": page})
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == page
        assert "x-request-id" in answer.headers["access-control-expose-headers"]
        refused = post(gw.url, headers={"origin": page})  # no key: its 401 readable by the page, still a 401
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == page
        assert "access-control-allow-origin" not in post(gw.url, key=key, headers={"origin": other}).headers
        streamed = {"origin": page, "authorization": f"Bearer {key}"}
        with httpx.stream("POST", gw.url + "/v1/completions", headers=streamed,
                          json={"model": "m", "prompt": "hi", "max_tokens": 4, "stream": True}, timeout=30) as s:
            assert s.headers["access-control-allow-origin"] == page and b"[DONE]" in s.read()
    finally:
        gw.stop()


def test_cors_origins_are_checked_in_the_fleet_file():
    from argosy.config import FleetConfigError, parse_fleet

    assert parse_fleet({"gateway": {"cors_allow_origins": ["*", "http://localhost:3000"]}}).gateway.cors_allow_origins
    with pytest.raises(FleetConfigError, match="is not an origin"):
        parse_fleet({"gateway": {"cors_allow_origins": ["https://app.example/path"]}})
