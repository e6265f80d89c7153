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
