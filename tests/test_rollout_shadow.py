"""Shadow evaluation through a real gateway (fixture upstreams): pairs reduced to numbers, never the text, a
judge model scoring them, and the report over the admin API and the CLI."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import openai

from tests.fleet_fixtures import ROOT
from tests.gateway_fixtures import start_gateway, start_upstream


def test_a_judge_scores_shadow_pairs_and_the_report_keeps_no_text():
    main, shadow, judge = start_upstream("main"), start_upstream("shadow"), start_upstream("judge")
    main.control(text="the cat sat on the mat")
    shadow.control(text="the cat lay on the rug")
    judge.control(text="8")
    gw = None
    try:
        gw = start_gateway({"models": [{
            "name": "m", "upstreams": [main.url],
            "shadow": {"revision": "v2", "sample": 1.0, "upstreams": [shadow.url]},
            "rollout": {"shadow": {"judge_url": judge.url + "/v1", "judge_model": "judge", "judge_sample": 1.0}}}]})
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)
        for i in range(3):
            out = c.completions.create(model="m", prompt=f"secret prompt {i}", max_tokens=6, temperature=0)
            assert out.choices[0].text == "the cat sat on the mat"  # the user's answer: the main upstream's
        deadline = time.monotonic() + 15
        while True:
            rep = httpx.get(gw.url + "/admin/shadow/m", timeout=10).json()["models"].get("m", {}).get("v2")
            if rep and rep["judged"] == 3:
                break
            assert time.monotonic() < deadline, rep
            time.sleep(0.2)
        assert rep["pairs"] == 3 and rep["greedy_pairs"] == 3 and rep["identical_greedy"] == 0.0
        assert rep["mean_first_diff_token"] is None  # this upstream sends no logprobs: no tokens to count
        assert rep["mean_length_ratio"] == 1.0
        assert rep["judge_mean"] == 0.8 and rep["same_finish_reason"] == 1.0
        assert judge.stats()["requests"] == 3
        raw = httpx.get(gw.url + "/admin/shadow", timeout=10).text
        assert "secret prompt" not in raw and "mat" not in raw and "rug" not in raw  # numbers only
        cli = subprocess.run([sys.executable, "-m", "argosy.cli", "rollout", "shadow", "m", "--url", gw.url],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert cli.returncode == 0 and "80.0%" in cli.stdout, cli.stdout + cli.stderr
    finally:
        if gw:
            gw.stop()
        for p in (main, shadow, judge):
            p.stop()


def test_rollout_and_shadow_endpoints_follow_the_admin_key_rules():
    from argosy.gateway.keys import new_key

    up = start_upstream("u")
    user_key, user_hash = new_key()
    admin_key, admin_hash = new_key()
    gw = None
    try:
        gw = start_gateway({"keys": [{"name": "user", "hash": user_hash}], "admin_key_hash": admin_hash,
                            "models": [{"name": "m", "upstreams": [up.url]}]})
        for method, path in (("GET", "/admin/rollouts"), ("GET", "/admin/rollouts/m"),
                             ("POST", "/admin/rollouts/m/start"), ("POST", "/admin/rollouts/m/abort"),
                             ("GET", "/admin/shadow"), ("GET", "/admin/shadow/m")):
            for key in (None, user_key):  # no key, or a user's key: refused before anything is read
                headers = {"authorization": f"Bearer {key}"} if key else {}
                r = httpx.request(method, gw.url + path, json={"to": "v2"}, headers=headers, timeout=10)
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_key", (method, path)
        adm = {"authorization": f"Bearer {admin_key}"}
        r = httpx.get(gw.url + "/admin/rollouts", headers=adm, timeout=10)
        assert r.status_code == 404 and "argosy serve" in r.json()["error"]["message"]  # a gateway alone
        assert httpx.get(gw.url + "/admin/shadow", headers=adm, timeout=10).json() == {"models": {}}
        assert httpx.get(gw.url + "/admin/shadow/nope", headers=adm, timeout=10).status_code == 404
        r = httpx.put(gw.url + "/admin/rollouts/m/start", headers=adm, timeout=10)
        assert r.status_code == 405
    finally:
        if gw:
            gw.stop()
        up.stop()
