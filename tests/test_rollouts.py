"""Rollouts with real replicas (`argosy engine` subprocesses on tiny random-weight checkpoints) behind a real
`argosy serve`, under steady load from the official openai client, which counts every request: each must
be answered in full (none failed, none cut off), and the log must tell the story.

Short analysis intervals and a few seconds of load each (CI); bench/rollout.py runs a longer canary.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx
import pytest

from argosy.config import parse_fleet
from argosy.fleet.placement import replica_need
from argosy.fleet.rollout.state import ModelState
from argosy.fleet.rollout.store import FileStore, RedisStore
from tests.fleet_fixtures import ROOT, Serve, ready
from tests.rollout_fixtures import Load, admin, broken_checkpoint, events, rollout_fleet, rollout_of, wait_rollout

pytestmark = pytest.mark.timeout(420)
QUICK = {"interval_s": 1.0, "min_samples": 2, "failure_limit": 2}


def started(s: Serve) -> Serve:
    s.wait_for("the stable replica", lambda st: len(ready(st)) >= 1)
    return s


def start(s: Serve, to: str, strategy: str = "canary") -> dict:
    return admin(s, "POST", "/admin/rollouts/tiny/start", {"to": to, "strategy": strategy})


def done(st: dict) -> bool:
    return st["rollout"] is not None and st["rollout"]["phase"] in ("succeeded", "aborted", "switched_back")


def metric(s: Serve, name: str, **labels) -> float | None:
    text = httpx.get(s.url + "/metrics", timeout=10).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(want)}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_a_healthy_canary_is_promoted_through_its_steps_and_the_old_revision_drained(tiny_llama, tmp_path):
    fleet = rollout_fleet(tiny_llama, [{"name": "v1"}, {"name": "v2", "engine": {"max_num_batched_tokens": 128}}], {
        "steps": [{"weight": 30, "pause_s": 1.0}, {"weight": 70, "pause_s": 1.0}],
        "analysis": {**QUICK, "gates": [{"metric": "error_rate", "max": 0}, {"metric": "ttft_p95", "max_ratio": 20}]}},
        str(tmp_path / "state.json"))
    s = started(Serve(fleet))
    try:
        load = Load(s.url, "tiny", workers=2).start()
        for path, body, status in (("/admin/rollouts/tiny/promote", {}, 409), ("/admin/rollouts/tiny/start",
                                   {"to": "v9"}, 400), ("/admin/rollouts/tiny/start", {"to": "v1"}, 409),
                                   ("/admin/rollouts/tiny/start", {"to": "v2", "strategy": "yolo"}, 400),
                                   ("/admin/rollouts/tiny/start", {}, 400), ("/admin/rollouts/nope/start",
                                   {"to": "v2"}, 404), ("/admin/rollouts/tiny/jump", {}, 404)):
            r = httpx.post(s.url + path, json=body, timeout=30)  # a clear OpenAI-format error, nothing changes
            assert r.status_code == status and r.json()["error"]["message"], (path, body, r.status_code, r.text)
        start(s, "v2")
        r = httpx.post(s.url + "/admin/rollouts/tiny/start", json={"to": "v2"}, timeout=30)
        assert r.status_code == 409 and "in progress" in r.json()["error"]["message"]
        st = wait_rollout(s, "the canary to be promoted", done, timeout=240)
        time.sleep(1)
        load.stop()
        print(load.summary())
        assert st["rollout"]["phase"] == "succeeded", st
        assert not load.failed, load.failed[:5]
        assert load.by_revision["v1"] and load.by_revision["v2"]
        assert st["stable"] == "v2" and st["split"] == {"v2": 100.0}
        assert [r["revision"] for r in s.fleet()["replicas"]] == ["v2"]  # the old one drained and stopped
        steps = [re.search(r'"weight": ([\d.]+)', ln).group(1) for ln in events(s, "rollout_step")]
        assert steps == ["30.0", "70.0"]
        analyses = events(s, "rollout_analysis")
        assert analyses and all('"verdict": "fail"' not in ln for ln in analyses)
        drained = [ln for ln in events(s, "replica_drained") if '"revision": "v1"' in ln]
        assert drained and '"left_in_flight": 0' in drained[0]
        for kind in ("rollout_started", "rollout_candidate_ready", "rollout_promoted", "rollout_old_drained",
                     "rollout_succeeded"):
            assert events(s, kind), f"no {kind} in the log"
        assert metric(s, "argosy_rollout_weight_percent", model="tiny", revision="v2") == 100
        assert metric(s, "argosy_rollout_finished_total", model="tiny", strategy="canary", outcome="succeeded") == 1
        cli = subprocess.run([sys.executable, "-m", "argosy.cli", "rollout", "status", "tiny", "--url", s.url],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert cli.returncode == 0 and "stable v2; split v2 100%" in cli.stdout and "succeeded" in cli.stdout
        assert ModelState.from_dict(_load(FileStore(fleet["state_file"]))).stable == "v2"
    finally:
        s.stop()


def _load(store) -> dict:
    import asyncio

    async def go():
        try:
            return await store.load("tiny")
        finally:
            await store.close()
    return asyncio.run(go())


def test_a_revision_that_cannot_load_then_one_slower_under_load_are_rolled_back(tiny_llama, tmp_path):
    """(c) v2's checkpoint cannot load: aborted. (b) v3 is honestly slower — one sequence at a time
    (max_num_seqs 1), so under concurrent load its requests queue behind each other while the stable
    batches them: rolled back by the TTFT gate within the intervals the config implies. One `argosy serve`,
    one load for both, none of its requests failed."""
    interval, limit = 2.0, 2
    bad = broken_checkpoint(tiny_llama, tmp_path / "broken")
    fleet = rollout_fleet(tiny_llama, [{"name": "v1"}, {"name": "v2", "checkpoint": bad},
                                       {"name": "v3", "engine": {"max_num_seqs": 1}}], {
        "steps": [{"weight": 50, "pause_s": 600}],
        "analysis": {"interval_s": interval, "min_samples": 3, "failure_limit": limit,
                     "gates": [{"metric": "ttft_p95", "max_ratio": 1.5}]}}, str(tmp_path / "state.json"))
    s = started(Serve(fleet))
    try:
        load = Load(s.url, "tiny", workers=4, max_tokens=24).start()
        start(s, "v2")
        st = wait_rollout(s, "the unloadable revision to be aborted", done, timeout=240)
        r = st["rollout"]
        assert r["phase"] == "aborted" and "revision v2 failed" in r["reason"], r
        assert st["split"] == {"v1": 100.0} and set(load.by_revision) == {"v1"}
        assert any('"revision": "v2"' in ln for ln in events(s, "replica_failed"))
        s.wait_for("only the stable's replica", lambda m: [x["revision"] for x in m["replicas"]] == ["v1"])

        start(s, "v3")
        st = wait_rollout(s, "the TTFT gate to abort the canary", lambda st: st["rollout"]["to_revision"] == "v3"
                          and done(st), timeout=240)
        time.sleep(1)
        load.stop()
        print(load.summary())
        r = st["rollout"]
        assert r["phase"] == "aborted" and "failed analyses" in r["reason"] and "ttft_p95" in r["reason"], r
        assert not load.failed, load.failed[:5]
        assert load.by_revision["v3"] and st["split"] == {"v1": 100.0} and st["stable"] == "v1"
        # within the intervals the config implies: failure_limit failed analyses, and at most one window before
        # them that did not fail: inconclusive (it began before the candidate had its share) or passed (the
        # candidate's queue was still empty; seen once in CI on 2 cores, where the stable's TTFT also varies)
        assert r["analyses"]["fail"] == limit and r["analyses"]["pass"] + r["analyses"]["inconclusive"] <= 1, r
        assert _at(r, "rollout_aborting") - _at(r, "rollout_step") <= (limit + 1) * interval + 2.0, r["events"]
        s.wait_for("the canary's replica to stop", lambda m: [x["revision"] for x in m["replicas"]] == ["v1"])
        assert len(events(s, "rollout_aborted")) == 2 and events(s, "rollout_candidate_drained")
        assert metric(s, "argosy_rollout_finished_total", model="tiny", strategy="canary", outcome="aborted") == 2
        assert [h["to_revision"] for h in rollout_of(s)["history"]] == ["v2", "v3"]
    finally:
        s.stop()


def _at(r: dict, kind: str) -> float:
    """Seconds of the day of the first event of a kind in the rollout's own list."""
    e = next(e for e in r["events"] if e["event"] == kind)
    h, m, sec = (int(x) for x in e["at"].split(":"))
    return h * 3600 + m * 60 + sec


def test_a_one_replica_model_upgrades_rolling_with_no_room_to_spare_and_no_failed_request(tiny_llama, tmp_path):
    fleet = rollout_fleet(tiny_llama, [{"name": "v1"}, {"name": "v2", "engine": {"max_num_batched_tokens": 128}}],
                          {"strategy": "rolling"}, str(tmp_path / "state.json"))
    engine = parse_fleet(fleet).models[0].resolved()["v1"].engine
    one = replica_need(tiny_llama, engine, on_gpu=False).gib
    fleet["nodes"] = [{"name": "only", "memory_gib": round(one * 1.5, 3)}]  # room for one replica, not two
    s = started(Serve(fleet))
    try:
        load = Load(s.url, "tiny", workers=2).start()
        time.sleep(1)
        start(s, "v2", "rolling")
        st = wait_rollout(s, "the rolling upgrade", done, timeout=240)
        time.sleep(1)
        load.stop()
        print(load.summary())
        assert st["rollout"]["phase"] == "succeeded" and st["stable"] == "v2", st
        assert not load.failed, load.failed[:5]
        assert load.by_revision["v1"] and load.by_revision["v2"]
        held = max(t for _, t, _ in load.ttfts)
        assert held > 1.0, "no request waited: nothing was held while the only replica was replaced"
        assert [x["revision"] for x in s.fleet()["replicas"]] == ["v2"]
        for kind in ("rollout_replica_draining", "rollout_replica_replaced", "rollout_succeeded"):
            assert events(s, kind), f"no {kind} in the log"
        assert not events(s, "unplaceable")
    finally:
        s.stop()


def test_blue_green_switches_and_switches_back_and_identical_revisions_agree(tiny_llama, tmp_path):
    fleet = rollout_fleet(tiny_llama, [{"name": "v1"}, {"name": "v2"}], {
        "strategy": "blue-green", "blue_green": {"shadow_sample": 1.0, "analysis_passes": 1, "scale_down_delay_s": 300},
        "analysis": {**QUICK, "min_samples": 3, "gates": [{"metric": "error_rate", "max": 0},
                                                         {"metric": "shadow_agreement", "min": 0.99}]}},
        str(tmp_path / "state.json"))
    s = started(Serve(fleet))
    try:
        load = Load(s.url, "tiny", workers=2, temperature=0.0).start()
        start(s, "v2", "blue-green")
        blue = [x["id"] for x in s.fleet()["replicas"] if x["revision"] == "v1"]
        st = wait_rollout(s, "the switch", lambda st: st["rollout"]["phase"] == "switched", timeout=240)
        before = {rev for t, _, rev in list(load.ttfts) if t < st["rollout"]["switched_at"]}
        assert before == {"v1"}, before  # until the switch the preview got shadow copies only
        time.sleep(1.5)
        assert load.by_revision["v2"] > 0
        st = admin(s, "POST", "/admin/rollouts/tiny/abort", {"reason": "switch back test"})
        assert st["stable"] == "v1" and st["split"]["v1"] == 100.0  # at once, in the answer
        n_v2 = load.by_revision["v2"]
        time.sleep(1.5)
        load.stop()
        print(load.summary())
        assert not load.failed, load.failed[:5]
        assert load.by_revision["v2"] <= n_v2 + 2  # at most the requests already routed when it switched
        assert [x["id"] for x in s.fleet()["replicas"] if x["revision"] == "v1"] == blue  # warm: the same replica
        st = wait_rollout(s, "the switch back", done)
        assert st["rollout"]["phase"] == "switched_back"
        report = admin(s, "GET", "/admin/shadow/tiny")["models"]["tiny"]["v2"]
        print(report)
        assert report["greedy_pairs"] >= 3 and report["identical_greedy"] == 1.0, report
        assert report["mean_logprob_divergence"] is None or report["mean_logprob_divergence"] < 1e-3
        assert any("shadow_agreement 1" in ln and '"verdict": "pass"' in ln for ln in events(s, "rollout_analysis"))
        for kind in ("rollout_preview_ready", "rollout_switched", "rollout_switched_back"):
            assert events(s, kind), f"no {kind} in the log"
        d = httpx.get(s.url + "/dashboard/data", timeout=10).json()
        assert d["rollouts"][0]["rollout"]["phase"] == "switched_back" and d["shadow"]["tiny"]["v2"]["pairs"]
        assert {r["revision"] for r in d["models"][0]["replicas"]} <= {"v1", "v2"}
        from tests.test_observe_fleet import CHROMIUM, chromium

        if CHROMIUM is not None:  # the page renders them (test_observe_fleet renders the rest)
            dom = chromium(s.url + "/dashboard", tmp_path, "--dump-dom")
            assert "blue-green v1 → v2" in dom and ">switched_back<" in dom and ">100.0 %<" in dom
    finally:
        s.stop()


def test_a_restart_mid_rollout_resumes_where_it_was(tiny_llama, tmp_path):
    from tests.gateway_fixtures import start_redis

    redis, url = start_redis()
    fleet = rollout_fleet(tiny_llama, [{"name": "v1"}, {"name": "v2", "engine": {"max_num_batched_tokens": 128}}],
                          {"steps": [{"weight": 50, "manual": True}], "analysis": {**QUICK, "gates": []}},
                          str(tmp_path / "unused.json"))
    fleet["gateway"]["redis_url"] = url  # the state lives in Redis
    s = started(Serve(fleet))
    try:
        start(s, "v2")
        wait_rollout(s, "the manual step", lambda st: st["rollout"]["phase"] == "progressing"
                     and st["rollout"]["weight"] == 50, timeout=240)
        load = Load(s.url, "tiny", workers=2).start()
        time.sleep(1.5)
        load.stop()
        assert not load.failed and load.by_revision["v2"], load.summary()
    finally:
        s.stop()  # gateway, controller and replicas all go; nothing aborted the rollout
    stored = ModelState.from_dict(_load(RedisStore(url)))
    assert (stored.rollout.phase, stored.rollout.step, stored.rollout.weight) == ("progressing", 0, 50.0)
    s = Serve(fleet)
    try:
        st = wait_rollout(s, "the rollout to resume", lambda st: st["rollout"]["phase"] == "progressing"
                          and len(ready(s.fleet())) == 2, timeout=240)
        assert st["split"] == {"v1": 50.0, "v2": 50.0} and st["rollout"]["step"] == 0
        assert events(s, "rollout_restored")
        load = Load(s.url, "tiny", workers=2).start()
        time.sleep(1.5)
        admin(s, "POST", "/admin/rollouts/tiny/promote")
        st = wait_rollout(s, "the promotion", done, timeout=240)
        time.sleep(1)
        load.stop()
        print(load.summary())
        assert st["rollout"]["phase"] == "succeeded" and st["stable"] == "v2"
        assert not load.failed, load.failed[:5]
        assert load.by_revision["v1"] and load.by_revision["v2"]
    finally:
        s.stop()
        redis.kill()
        redis.wait()


def test_shadow_agreement_of_the_builtin_model_and_random_weights_of_its_shape_is_near_zero(tmp_path):
    from argosy.models.builtin import BUILTIN_MODEL_DIR
    from tests.rollout_fixtures import random_twin

    twin = random_twin(BUILTIN_MODEL_DIR, tmp_path / "random")
    fleet = rollout_fleet(str(BUILTIN_MODEL_DIR), [{"name": "v1"}, {"name": "v2", "checkpoint": twin}], {
        "steps": [{"weight": 0, "manual": True}], "shadow": {"sample": 1.0}, "analysis": {**QUICK, "gates": []}},
        str(tmp_path / "state.json"))
    fleet["models"][0]["engine"] = {"kv_cache_memory_gib": 0.05, "max_num_seqs": 8}
    s = started(Serve(fleet))
    try:
        start(s, "v2")
        wait_rollout(s, "the candidate", lambda st: st["rollout"]["phase"] == "progressing", timeout=240)
        load = Load(s.url, "tiny", workers=2, temperature=0.0).start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rep = admin(s, "GET", "/admin/shadow/tiny")["models"].get("tiny", {}).get("v2", {})
            if rep.get("greedy_pairs", 0) >= 10:
                break
            time.sleep(0.5)
        load.stop()
        print(load.summary(), rep)
        assert not load.failed and set(load.by_revision) == {"v1"}  # the user's answer always from the stable
        assert rep["greedy_pairs"] >= 10 and rep["identical_greedy"] <= 0.1, rep
        assert rep["mean_first_diff_token"] is not None and rep["mean_first_diff_token"] < 3
        cli = subprocess.run([sys.executable, "-m", "argosy.cli", "rollout", "shadow", "--url", s.url],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert cli.returncode == 0 and "tiny" in cli.stdout and "v2" in cli.stdout
        admin(s, "POST", "/admin/rollouts/tiny/abort")
    finally:
        s.stop()


def test_rollout_commands_use_the_local_admin_credential_once_the_fleet_has_keys(tiny_llama, tmp_path):
    # A fleet with a user key and no admin key: /admin/* then takes only the local admin credential that
    # `argosy serve` writes, which `argosy status` and `argosy keys` use; `argosy rollout` sent nothing (401).
    from argosy.gateway.keys import new_key

    _, key_hash = new_key()
    fleet = rollout_fleet(tiny_llama, [{"name": "v1"}, {"name": "v2"}], {}, str(tmp_path / "state.json"),
                          min_replicas=0)
    fleet["keys"] = [{"name": "team", "hash": key_hash}]
    s = Serve(fleet)
    try:
        assert httpx.get(s.url + "/admin/rollouts/tiny", timeout=10).status_code in (401, 403)
        cli = subprocess.run([sys.executable, "-m", "argosy.cli", "rollout", "status", "tiny", "--url", s.url],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert cli.returncode == 0, cli.stderr
        assert "stable v1; split v1 100%" in cli.stdout
    finally:
        s.stop()


def test_status_and_rollout_reach_a_gateway_on_every_address_through_loopback(tiny_llama, tmp_path):
    # `gateway.host: 0.0.0.0` (what a server runs): the local admin credential names http://0.0.0.0:PORT, and
    # `argosy status --url http://127.0.0.1:PORT` (or the default URL) had not sent it: 403, locked out.
    from argosy.gateway.keys import new_key

    _, key_hash = new_key()
    fleet = rollout_fleet(tiny_llama, [{"name": "v1"}, {"name": "v2"}], {}, str(tmp_path / "state.json"),
                          min_replicas=0)
    fleet["keys"] = [{"name": "team", "hash": key_hash}]
    fleet["gateway"]["host"] = "0.0.0.0"
    s = Serve(fleet)
    try:
        local = "http://127.0.0.1:" + s.url.rsplit(":", 1)[1]
        for command in (["status"], ["rollout", "status"]):
            cli = subprocess.run([sys.executable, "-m", "argosy.cli", *command, "--url", local],
                                 capture_output=True, text=True, cwd=ROOT, timeout=60)
            assert cli.returncode == 0, cli.stderr
            assert "model tiny" in cli.stdout
        keys = [sys.executable, "-m", "argosy.cli", "keys"]
        cli = subprocess.run([*keys, "list", "--url", local], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert cli.returncode == 0 and "team" in cli.stdout, cli.stderr  # had been 403 as well
        cli = subprocess.run([*keys, "revoke", "nobody", "--url", local], capture_output=True, text=True, cwd=ROOT,
                             timeout=60)
        assert cli.returncode == 2 and "no key named 'nobody'" in cli.stderr  # had printed {"ok": false}
    finally:
        s.stop()
