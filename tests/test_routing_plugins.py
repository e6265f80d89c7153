"""Routing as filters, scorers and a picker: weights from the fleet file, a scorer added from outside
the router, what a router needs scraped, and load as one quantity."""

from __future__ import annotations

import pytest

from argosy.config import FleetConfigError, RoutingConfig, parse_fleet
from argosy.gateway.health import Upstream
from argosy.gateway.prefix_index import PrefixIndex
from argosy.gateway.router import Router, RouteRequest
from argosy.gateway.routing.presets import PRESETS
from argosy.gateway.routing.scorers import SCORERS, Scorer, least_is_best, register


def router(n: int = 3, **routing) -> tuple[Router, list[Upstream]]:
    r = Router(RoutingConfig(**routing), None, PrefixIndex())
    ups = [Upstream(f"http://u{i}") for i in range(n)]
    r.set_upstreams(ups)
    return r, ups


def picks(r: Router, n: int = 12, **req) -> list[str]:
    return [r.choose(RouteRequest("p", 1, **req)).url for _ in range(n)]


@pytest.fixture
def scorer_registry():
    saved = dict(SCORERS)
    yield SCORERS
    SCORERS.clear()
    SCORERS.update(saved)


def test_a_new_scorer_changes_routing_without_touching_the_router(scorer_registry):
    @register
    class LeastKVScorer(Scorer):  # the few lines a user writes
        name = "least_kv"

        def score(self, req, cands):
            return least_is_best([u.kv_usage for u in cands])

    before, ups = router(policy="least_load")
    for u, kv in zip(ups, (0.9, 0.2, 0.6), strict=True):
        u.kv_usage = kv
        u.in_flight = 2
    ups[1].in_flight = 3  # one request more than the others, but the most free KV cache
    assert set(picks(before)) == {"http://u2"}  # least load (u0, u2), then the most free KV cache
    cfg = parse_fleet({"models": [{"name": "m", "upstreams": [u.url for u in ups],
                                   "routing": {"scorers": {"least_kv": 2, "load": 1}}}]}).models[0]
    after = Router(cfg.routing, None, PrefixIndex())
    after.set_upstreams(ups)
    assert set(picks(after)) == {"http://u1"}


def test_weights_from_the_fleet_file_are_checked():
    ok = parse_fleet({"models": [{"name": "m", "routing": {"scorers": {"prefix": 2, "load": 1}}}]})
    assert ok.models[0].routing.scorer_weights() == {"prefix": 2, "load": 1}
    assert parse_fleet({}).models == [] and RoutingConfig().scorer_weights() == PRESETS["least_load"]
    bad = [({"scorers": {"prefx": 1}}, "unknown scorer 'prefx'"),
           ({"scorers": {"load": -1}}, "must be a finite number >= 0"),
           ({"policy": "prefix", "scorers": {"load": 1}}, "not both"),
           ({"policy": "fastest"}, "routing.policy")]
    for routing, message in bad:
        with pytest.raises(FleetConfigError, match=message):
            parse_fleet({"models": [{"name": "m", "routing": routing}]})


def test_every_preset_names_registered_scorers():
    for policy, weights in PRESETS.items():
        assert set(weights) <= set(SCORERS), policy
        Router(RoutingConfig(policy=policy), None, PrefixIndex())


def test_the_gateway_scrapes_only_for_scorers_that_read_gauges():
    assert not router(policy="round_robin")[0].needs_gauges
    for policy in ("least_load", "prefix", "session", "length_classes"):
        assert router(policy=policy)[0].needs_gauges, policy
    assert not router(scorers={"prefix": 1, "cache_spread": 1})[0].needs_gauges
    assert router(scorers={"prefix": 1})[0].needs_prompt and not router()[0].needs_prompt


def test_load_is_requests_and_kv_usage_only_breaks_ties():
    u = Upstream("http://x")
    u.in_flight, u.remote_in_flight, u.waiting, u.kv_usage = 2, 1, 4.0, 0.9
    u.tokens_in_flight = 100_000
    assert u.load() == 7  # requests: 2 here + 1 at other gateways + 4 waiting at the replica
    r, ups = router(policy="least_load")
    ups[0].kv_usage, ups[1].kv_usage, ups[2].kv_usage = 0.5, 0.1, 0.1
    ups[1].in_flight = 1
    assert set(picks(r)) == {"http://u2"}  # equal load: the most free KV cache
    ups[0].kv_usage = ups[1].kv_usage = ups[2].kv_usage = 0.0
    assert set(picks(r, 6)) == {"http://u0", "http://u2"}  # real ties rotate


def test_tokens_scorer_weighs_long_requests():
    r, ups = router(scorers={"load": 1, "tokens": 0.5})
    ups[0].on_start(8000)
    ups[1].on_start(10)
    ups[2].on_start(10)
    ups[2].in_flight += 1
    assert set(picks(r)) == {"http://u1"}


def test_the_simulator_routes_with_the_fleet_files_weights():
    from tests.test_sim import constant_profile, simulate

    spec = {"duration_s": 20, "rate": 40, "prompt_tokens": {"mean": 64}, "output_tokens": {"mean": 16},
            "shared_prefix": {"tokens": 512, "groups": 8}}
    small = constant_profile(num_blocks=160)
    _, rr = simulate(spec, {"routing": {"scorers": {}}}, profile=small, replicas=4)
    sim, weighted = simulate(spec, {"routing": {"scorers": {"prefix": 3, "load": 1}}}, profile=small, replicas=4)
    assert sim.uses_text  # a scorer reads the prompt, so the simulator builds it
    assert weighted["prefix_cache_hit_rate"] > rr["prefix_cache_hit_rate"] + 0.1


def test_a_gateway_scrapes_replica_gauges_for_weights_given_in_the_fleet_file():
    import time

    import httpx
    import openai

    from tests.gateway_fixtures import start_gateway, start_upstream

    ups = [start_upstream(f"u{i}") for i in range(2)]
    gw = None
    try:
        gw = start_gateway({"gateway": {"health_interval_s": 0.3}, "models": [
            {"name": "q", "upstreams": [u.url for u in ups], "routing": {"scorers": {"queue": 1}}}]})
        ups[0].control(waiting=20)  # only the scraped gauge tells the two apart
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the gateway has scraped it
            seen = httpx.get(gw.url + "/admin/upstreams", timeout=10).json()["models"]["q"]["v1"]
            if [u["waiting"] for u in seen] == [20, 0]:
                break
            time.sleep(0.1)
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)
        got = {c.completions.create(model="q", prompt="hi", max_tokens=2).system_fingerprint for _ in range(6)}
        assert got == {"u1"}
    finally:
        if gw:
            gw.stop()
        for u in ups:
            u.stop()


def test_an_upstream_added_while_the_gateway_runs_is_scraped_too():
    # `argosy serve` adds every replica after the gateway started: the scrape set is read each round.
    import time

    import httpx

    from tests.gateway_fixtures import start_gateway, start_upstream

    up = start_upstream("late")
    gw = None
    try:
        gw = start_gateway({"gateway": {"health_interval_s": 0.3}, "models": [
            {"name": "q", "upstreams": [], "routing": {"scorers": {"queue": 1}}}]})
        added = httpx.post(gw.url + "/admin/upstreams", json={"model": "q", "url": up.url}, timeout=10)
        assert added.status_code == 200
        up.control(waiting=7)
        deadline, seen = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            seen = httpx.get(gw.url + "/admin/upstreams", timeout=10).json()["models"]["q"]["v1"]
            if [u["waiting"] for u in seen] == [7]:
                break
            time.sleep(0.1)
        assert [u["waiting"] for u in seen] == [7]
    finally:
        if gw:
            gw.stop()
        up.stop()
