"""Rollouts without processes: the fleet file's revisions and gates, the analysis verdicts, the state
store's atomic writes (and Redis), shadow pairs reduced to numbers, and the gateway's revision choice."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from argosy.config import FleetConfigError, load_fleet, parse_fleet
from argosy.config_rollout import AnalysisGate
from argosy.fleet.rollout.analysis import FAIL, INCONCLUSIVE, PASS, Side, evaluate
from argosy.fleet.rollout.state import ModelState, Rollout
from argosy.fleet.rollout.store import FileStore, RedisStore
from argosy.gateway.prefix_index import PrefixIndex
from argosy.gateway.revision_stats import WindowStats
from argosy.gateway.shadow_pairs import Output, PairStore, compare, parse_output
from argosy.gateway.traffic import ModelRuntime, UpstreamRegistry

ROOT = Path(__file__).resolve().parents[1]


def model(**fields) -> dict:
    return {"name": "m", "checkpoint": "/ckpt", **fields}


def test_a_model_without_revisions_is_one_revision_and_existing_files_stay_valid():
    fleet = load_fleet(ROOT / "examples" / "fleet.example.yaml")  # written before revisions existed
    chat = fleet.models[0]
    assert list(chat.resolved()) == ["v1"] and chat.resolved()["v1"].checkpoint == chat.checkpoint
    m = parse_fleet({"models": [model(engine={"max_num_seqs": 8}, autoscaling={"max_replicas": 3}, revisions=[
        {"name": "a"}, {"name": "b", "checkpoint": "/other", "engine": {"kv_cache_memory_gib": 0.5},
                        "autoscaling": {"max_replicas": 1}}])]}).models[0]
    assert m.stable_at_start() == "a"  # the first listed, unless `revision` names one
    a, b = m.resolved()["a"], m.resolved()["b"]
    assert (a.checkpoint, b.checkpoint) == ("/ckpt", "/other")
    assert b.engine.max_num_seqs == 8 and b.engine.kv_cache_memory_gib == 0.5  # the model's fields, then its own
    assert a.autoscaling.max_replicas == 3 and b.autoscaling.max_replicas == 1


@pytest.mark.parametrize("fields, message", [
    ({"revisions": [{"name": "a"}, {"name": "a"}]}, "names must be unique"),
    ({"revision": "c", "revisions": [{"name": "a"}]}, "'c' is not one of revisions"),
    ({"checkpoint": None, "revisions": [{"name": "a"}]}, "'a' has no checkpoint"),
    ({"traffic": [{"revision": "a", "weight": 1}], "revisions": [{"name": "a"}]}, "no traffic or upstreams"),
    ({"autoscaling": {"min_replicas": 3}, "revisions": [{"name": "a", "autoscaling": {"max_replicas": 2}}]},
     "min_replicas (3) exceeds max_replicas (2)"),
    ({"rollout": {"analysis": {"gates": [{"metric": "ttft_p95", "min": 0.1}]}}}, "min does not apply"),
    ({"rollout": {"analysis": {"gates": [{"metric": "tokens_per_s_per_replica", "max_ratio": 2}]}}},
     "max_ratio does not apply"),
    ({"rollout": {"analysis": {"gates": [{"metric": "error_rate"}]}}}, "give a bound"),
    ({"rollout": {"steps": [{"weight": 50, "pause_s": 1}, {"weight": 10, "pause_s": 1}]}}, "must not decrease"),
    ({"rollout": {"steps": [{"weight": 50}]}}, "pause_s (seconds) or manual"),
    ({"rollout": {"analysis": {"gates": [{"metric": "shadow_agreement", "min": 0.9}]},
                  "blue_green": {"shadow_sample": 0}}}, "needs shadow.sample > 0"),
    ({"rollout": {"stratgy": "canary"}}, "stratgy"),
])
def test_revision_and_rollout_errors_name_the_field(fields, message):
    with pytest.raises(FleetConfigError) as e:
        parse_fleet({"models": [model(**fields)]}, "fleet.yaml")
    assert message in str(e.value) and "fleet.yaml" in str(e.value)


# ---------------------------------------------------------------------- analysis

def window(n: int, ttft: float, failed: int = 0) -> WindowStats:
    return WindowStats(requests=n + failed, failed=failed, ttft=[ttft] * n, e2e=[ttft * 2] * n, gaps=[0.01] * n,
                       tokens=16 * n)


def gate(**kw) -> AnalysisGate:
    return AnalysisGate(**kw)


def test_a_quiet_window_is_inconclusive_never_a_pass():
    gates = [gate(metric="ttft_p95", max_ratio=1.2)]
    quiet = evaluate(gates, Side(window(4, 0.1)), Side(window(50, 0.1)), 10, min_samples=5)
    assert quiet.verdict == INCONCLUSIVE  # the candidate's 4 samples are under min_samples, however good
    assert evaluate(gates, Side(window(50, 0.1)), Side(window(4, 0.1)), 10, 5).verdict == INCONCLUSIVE  # the baseline
    assert evaluate(gates, Side(window(5, 0.1)), Side(window(5, 0.1)), 10, 5).verdict == PASS
    assert evaluate([gate(metric="error_rate", max=0.0)], Side(WindowStats()), Side(window(9, 0.1)), 10,
                    1).verdict == INCONCLUSIVE  # nothing at all is not a pass either


def test_relative_and_absolute_gates():
    slow, base = Side(window(20, 0.30)), Side(window(20, 0.20))
    r = evaluate([gate(metric="ttft_p95", max_ratio=1.2)], slow, base, 10, 5)
    assert r.verdict == FAIL and r.gates[0].candidate == 0.3 and r.gates[0].stable == 0.2
    assert "1.2x stable (0.24s)" in r.story()
    assert evaluate([gate(metric="ttft_p95", max_ratio=1.6)], slow, base, 10, 5).verdict == PASS
    assert evaluate([gate(metric="ttft_p95", max=0.25)], slow, base, 10, 5).verdict == FAIL
    errs = Side(window(19, 0.2, failed=1))  # 1 of 20 failed: 5%
    assert evaluate([gate(metric="error_rate", max=0.01)], errs, base, 10, 5).verdict == FAIL
    assert evaluate([gate(metric="error_rate", max=0.1)], errs, base, 10, 5).verdict == PASS
    # tokens/s per replica: 320 tokens over 10 s on 2 replicas is 16; the stable's 32 on one
    thin = Side(window(20, 0.2), replicas=2)
    r = evaluate([gate(metric="tokens_per_s_per_replica", min_ratio=0.9)], thin, base, 10, 5)
    assert r.verdict == FAIL and r.gates[0].candidate == 16.0 and r.gates[0].stable == 32.0
    agree = Side(window(20, 0.2), agreement=0.8, agreement_pairs=10)
    assert evaluate([gate(metric="shadow_agreement", min=0.9)], agree, base, 10, 5).verdict == FAIL
    assert evaluate([gate(metric="shadow_agreement", min=0.9)], agree, base, 10, 11).verdict == INCONCLUSIVE
    # one failing gate fails the analysis even when another is inconclusive
    both = [gate(metric="ttft_p95", max=0.25), gate(metric="shadow_agreement", min=0.5)]
    assert evaluate(both, slow, base, 10, 5).verdict == FAIL


# ---------------------------------------------------------------------- state

def state() -> ModelState:
    r = Rollout("m-v2-1", "canary", "v1", "v2", size=2, phase="progressing", step=1, weight=50)
    return ModelState("m", "v1", {"v1": 50.0, "v2": 50.0}, r)


def test_state_file_round_trip_and_a_failed_write_leaves_the_old_state(tmp_path, monkeypatch):
    store = FileStore(tmp_path / "state" / "fleet.json")
    asyncio.run(store.save("m", state().as_dict()))
    back = ModelState.from_dict(asyncio.run(store.load("m")))
    assert back.rollout.step == 1 and back.rollout.weight == 50 and back.split == {"v1": 50.0, "v2": 50.0}
    before = store.path.read_bytes()

    def dump_then_die(obj, f, **kw):  # the process dies half way through writing the new state
        f.write(json.dumps(obj)[:20])
        raise OSError("disk full")

    monkeypatch.setattr("argosy.fleet.rollout.store.json.dump", dump_then_die)
    s2 = state()
    s2.rollout.step = 2
    with pytest.raises(OSError):
        asyncio.run(store.save("m", s2.as_dict()))
    assert store.path.read_bytes() == before  # the old state, whole
    assert os.listdir(store.path.parent) == ["fleet.json"]  # no temporary file left behind


def test_state_in_redis(tmp_path):
    from tests.gateway_fixtures import start_redis

    proc, url = start_redis()
    try:
        async def go():
            store = RedisStore(url)
            await store.save("m", state().as_dict())
            again = RedisStore(url)  # another process (a restarted controller) reads it back
            got = await again.load("m")
            await store.close()
            await again.close()
            return got
        assert ModelState.from_dict(asyncio.run(go())).rollout.to_revision == "v2"
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------- shadow pairs

def sse(*events: dict) -> list[bytes]:
    return [b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"]


def chunk(text: str, token_lp: list[tuple[str, float]] | None = None, finish=None) -> dict:
    lp = {"tokens": [t for t, _ in token_lp], "token_logprobs": [x for _, x in token_lp]} if token_lp else None
    return {"choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}]}


def test_a_pair_is_reduced_to_numbers():
    cand = parse_output(sse(chunk("The cat", [("The", -0.1), (" cat", -0.2)]),
                            chunk(" sat", [(" sat", -0.3)], "length")), True)
    assert cand.text == "The cat sat" and cand.tokens == ["The", " cat", " sat"] and cand.finish == "length"
    same = parse_output([json.dumps({"choices": [{"index": 0, "text": "The cat sat", "finish_reason": "length"}],
                                     "usage": {"completion_tokens": 3}}).encode()], False)
    rec = compare(same, cand, "v2", greedy=True, prompt_tokens=40, now=1.0)
    assert rec.identical and rec.first_diff is None and rec.length_ratio == 1.0 and rec.prompt_bucket == "<128"
    other = Output("The dog sat", None, None, "stop", 3)  # no logprobs: walked along the candidate's tokens
    rec = compare(other, cand, "v2", greedy=True, prompt_tokens=600, now=1.0)
    assert not rec.identical and rec.first_diff == 1 and rec.prompt_bucket == "512-2047"
    assert (rec.finish_user, rec.finish_candidate) == ("stop", "length")
    with_lp = Output("The cow", ["The", " cow"], [-0.5, -1.0], "length", 2)
    rec = compare(with_lp, cand, "v2", greedy=True, prompt_tokens=5, now=1.0)
    assert rec.first_diff == 1 and rec.logprob_divergence == 0.4  # |-0.5 - -0.1| over the token both chose
    assert rec.length_ratio == 1.5
    blind = compare(Output("a b"), Output("a c"), "v2", True, 5, 1.0)  # no tokens either side: only "different"
    assert not blind.identical and blind.first_diff is None
    store = PairStore()
    for t, identical in ((1.0, True), (2.0, True), (3.0, False)):
        store.add("m", compare(same if identical else other, cand, "v2", True, 40, t))
    store.add("m", compare(other, cand, "v2", False, 40, 2.5))  # sampled: not counted by the gate
    assert store.agreement("m", "v2", 0, 10) == (2 / 3, 3)
    assert store.agreement("m", "v2", 0, 2.5) == (1.0, 2)
    report = store.report("m")["m"]["v2"]
    assert report["pairs"] == 4 and report["identical_greedy"] == round(2 / 3, 4)
    assert report["by_prompt_tokens"]["<128"]["pairs"] == 4


# ---------------------------------------------------------------------- the gateway's revision choice

def runtime() -> ModelRuntime:
    fleet = parse_fleet({"models": [model(revisions=[{"name": "v1"}, {"name": "v2"}],
                                          routing={"policy": "round_robin"})]})
    rt = ModelRuntime(fleet.models[0], UpstreamRegistry(fleet.gateway), PrefixIndex(), None, lambda: None)
    rt.add_upstream("http://127.0.0.1:1", "v1")
    rt.add_upstream("http://127.0.0.1:2", "v2")
    return rt


def test_a_session_stays_on_the_revision_it_started_on_while_the_split_moves():
    rt = runtime()
    rt.set_split({"v1": 90, "v2": 10}, "v1")
    rt.set_rollout("v2")
    first = {f"s{i}": rt.pick(f"s{i}")[0] for i in range(400)}
    assert 10 < sum(r == "v2" for r in first.values()) < 80
    rt.set_split({"v1": 10, "v2": 90}, "v1")  # the canary's next step
    assert {s: rt.pick(s)[0] for s in first} == first
    new = [rt.pick(f"new{i}")[0] for i in range(200)]
    assert sum(r == "v2" for r in new) > 150  # new sessions follow the new weights
    rt.set_split({"v1": 100, "v2": 0}, "v1")  # aborted: the canary's sessions move to the stable
    assert {rt.pick(s)[0] for s in first} == {"v1"}


def test_the_revision_header_the_fallback_and_a_revision_with_nothing_live():
    rt = runtime()
    assert rt.pick(None, "v2")[0] == "v1"  # no rollout: the header selects nothing
    rt.set_rollout("v2")
    assert rt.pick(None, "v2")[0] == "v2" and rt.pick(None, "nope")[0] == "v1"
    rt.set_split({"v1": 0.001, "v2": 99.999}, "v1")
    assert rt.fallback_for("v2")[0] == "v1" and rt.fallback_for("v1") is None
    rt.remove_upstream("http://127.0.0.1:2")  # the candidate lost its replica: its share goes to the stable
    assert {rt.pick(None)[0] for _ in range(50)} == {"v1"}
    rt.set_split({"v2": 100}, "v2")  # one revision weighted, none of its replicas live (a rolling upgrade)
    assert rt.pick(None)[0] == "v1"
