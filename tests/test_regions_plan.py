"""Planning with regions (docs/regions.md): the simulator routes between regions with the gateways' own
region filters and scorers, simulates spot preemptions with notice, and `argosy plan` with a fleet file
whose regions list capacity answers the cheapest mix of reserved, on-demand and spot per region for a
week, with $/month and $/Mtok. (The same scenario through real gateways: test_regions_netns.py (f).)"""

from __future__ import annotations

import json

import pytest

from argosy.cli import main
from argosy.config import parse_fleet
from argosy.sim.capacity_mix import HOURS, region_mix, week_factors
from argosy.sim.fleet import FleetSim, SimSettings
from argosy.sim.profile import StepProfile
from argosy.sim.results import SLO, render_text, summarize
from argosy.sim.traffic import Failure, Lengths, Region, TrafficSpec, make_requests

REGIONS = ["eu-west", "eu-north", "us-east"]
RTT_S = {"eu-west": {"eu-north": 0.03, "us-east": 0.08}, "eu-north": {"us-east": 0.11}}


def fleet_doc(hold_down_s: float = 2.0, ramp_s: float = 0.0, capacity: dict | None = None) -> dict:
    juris = {"eu-west": "eu", "eu-north": "eu", "us-east": "us"}
    return {"region_routing": {"hold_down_s": hold_down_s, "ramp_s": ramp_s},
            "regions": [{"name": r, "provider": "p", "jurisdiction": juris[r], "gateway": f"http://{r}.test:8000",
                         **({"capacity": capacity[r]} if capacity and r in capacity else {})} for r in REGIONS],
            "models": [{"name": "chat"}]}


# One step 10 ms whatever the batch: an 8-token answer takes about 90 ms; 1 s cold start.
PROFILE = StepProfile("flat", "cpu", "measured", "sum", base_s=0.01, per_prefill_token_s=0.0, per_decode_seq_s=0.0,
                      mem_base_s=0.0, per_kv_token_s=0.0, num_blocks=100_000, cold_start_s=1.0)


def run(spec: TrafficSpec, fleet: dict | None) -> FleetSim:
    cfg = parse_fleet(fleet) if fleet else None
    model = cfg.models[0] if cfg else parse_fleet({"models": [{"name": "chat"}]}).models[0]
    sim = FleetSim(model, PROFILE, spec, make_requests(spec), SimSettings(replicas=1), fleet=cfg)
    sim.run()
    return sim


def served(sim: FleetSim, arrival: str, t0: float, t1: float) -> dict[str, int]:
    got: dict[str, int] = {}
    for q in sim.done:
        if REGIONS[q.region] == arrival and t0 <= q.arrival_s < t1:
            where = q.replica.rsplit("-", 1)[0]
            got[where] = got.get(where, 0) + 1
    return got


def test_sim_fails_a_region_over_by_the_gateways_rule_and_back_after_the_hold_down():
    spec = TrafficSpec(duration_s=20, rate=30, seed=1, regions=[Region(name=r) for r in REGIONS],
                       prompt_tokens=Lengths(mean=4), output_tokens=Lengths(mean=8), rtt_s=RTT_S,
                       failures=[Failure(region="eu-north", at_s=5, duration_s=5)])
    sim = run(spec, fleet_doc(hold_down_s=3.0))
    # Only streams already under way on eu-north when it died are lost (the gateway retries before the first
    # byte only); everything that arrived after was served.
    assert all(REGIONS[q.region] == "eu-north" and 4.5 < q.arrival_s < 5 for q in sim.failed), sim.failed
    assert set(served(sim, "eu-north", 0.5, 4.9)) == {"eu-north"}  # home while it has room
    # Out: the nearest region by measured round trip (eu-west, 30 ms) takes all of it, not us-east (110 ms).
    down = served(sim, "eu-north", 5.5, 10)
    assert set(down) == {"eu-west"} and down["eu-west"] >= 10, down
    # Back at 10 s (a replica restarts cold: about 1 s) but held down 3 s: still away until about 14 s.
    assert "eu-north" not in served(sim, "eu-north", 10, 13.5)
    assert set(served(sim, "eu-north", 15, 20)) == {"eu-north"}
    away = [q for q in sim.done if REGIONS[q.region] == "eu-north" and 5.5 <= q.arrival_s < 10]
    assert all(q.extra_latency_s == pytest.approx(0.03) for q in away)  # that pair's round trip, added
    res = summarize(sim, SLO(), warmup_s=5.5)  # `argosy sim`'s answer says who served what
    assert res["served_by"]["eu-north"]["eu-west"] >= down["eu-west"] and "us-east" not in res["served_by"]["eu-north"]
    assert "arrived in eu-north: served" in render_text(res)
    # Without a fleet file the sim knows no region routing: the old even spread over the live regions.
    old = served(run(spec, None), "eu-north", 5.5, 10)
    assert old.get("us-east", 0) > 0


def test_sim_spills_a_saturated_region_and_keeps_the_others_at_home():
    # eu-north gets 4x its share: one replica of concurrency 8 (max_num_seqs) is saturated, the rest spills.
    spec = TrafficSpec(duration_s=10, rate=200, seed=2, regions=[Region(name="eu-west", share=1),
                                                                 Region(name="eu-north", share=4),
                                                                 Region(name="us-east", share=1)],
                       prompt_tokens=Lengths(mean=4), output_tokens=Lengths(mean=8), rtt_s=RTT_S)
    doc = fleet_doc()
    doc["models"] = [{"name": "chat", "engine": {"max_num_seqs": 8}}]
    sim = run(spec, doc)
    north = served(sim, "eu-north", 1, 10)
    assert north.get("eu-north", 0) > 0 and north.get("eu-west", 0) + north.get("us-east", 0) > 0, north
    assert set(served(sim, "us-east", 1, 10)) <= {"us-east", "eu-west"}


def test_spot_preemption_with_notice_drains_and_replaces_without_loss():
    def sim_with(notice_s: float | None) -> FleetSim:
        spec = TrafficSpec(duration_s=10, rate=20, seed=4, prompt_tokens=Lengths(mean=4),
                           output_tokens=Lengths(mean=200),  # 2 s each: several in flight at the notice
                           failures=[Failure(region="default", at_s=4, duration_s=1, replica=0, notice_s=notice_s)])
        sim = FleetSim(parse_fleet({"models": [{"name": "m"}]}).models[0], PROFILE, spec, make_requests(spec),
                       SimSettings(replicas=1))
        sim.run()
        return sim

    noticed = sim_with(30.0)
    assert noticed.preemptions == 1 and not noticed.failed
    assert len({q.replica for q in noticed.done}) == 2  # the preempted one, then its replacement
    cut = sim_with(0.0)  # no time to drain: what it held with tokens out is lost
    assert cut.preemptions == 1 and cut.failed
    with pytest.raises(ValueError, match="notice_s"):
        TrafficSpec(duration_s=1, rate=1, failures=[Failure(region="default", at_s=0, duration_s=1, notice_s=5)])


def test_region_mix_takes_reserved_where_it_pays_for_the_week_and_the_burst_on_spot_and_on_demand():
    prices = {"reserved": {"usd_per_hour": 2.0, "max_replicas": None},
              "on_demand": {"usd_per_hour": 4.0, "max_replicas": 3},
              "spot": {"usd_per_hour": 1.0, "max_replicas": 1}}
    need = [2] * 84 + [6] * 42 + [1] * 42  # 2 replicas half the week, 6 a quarter, 1 a quarter
    m = region_mix(need, prices, 0.5)
    # The burst costs 0.5 x 1 + 0.5 x 4 = 2.5 $/h. A 1st reserved replica (busy all 168 h) pays for the week:
    # 336 < 420; a 2nd (busy 126 h) does not: 336 > 315.
    assert m["reserved"] == 1
    # Burst 1 for 84 h (on-demand: half of 1 rounds down to no spot), 5 for 42 h (2 on spot, capped at 1; 4
    # on-demand, beyond its 3: 1 unmet and said so).
    assert (m["spot_peak"], m["on_demand_peak"], m["unmet_replicas"]) == (1, 4, 1)
    assert m["usd_per_week"] == pytest.approx(168 * 2.0 + (84 + 42 * 4) * 4.0 + 42 * 1.0)
    assert m["usd_per_month"] == pytest.approx(m["usd_per_week"] * 730 / HOURS, abs=0.01)
    assert region_mix(need, prices, 0.0)["spot_peak"] == 0
    no_reserved = {**prices, "reserved": {"usd_per_hour": None, "max_replicas": 0}}
    assert region_mix(need, no_reserved, 1.0)["reserved"] == 0
    # Only reserved offered: it carries the peak whatever it costs.
    only_reserved = {"reserved": prices["reserved"], "on_demand": {"usd_per_hour": None, "max_replicas": 0},
                     "spot": {"usd_per_hour": None, "max_replicas": 0}}
    assert region_mix(need, only_reserved, 1.0)["reserved"] == 6
    # Spot dearer than on-demand is not taken for the burst.
    dear_spot = {**prices, "spot": {"usd_per_hour": 5.0, "max_replicas": None}}
    assert region_mix(need, dear_spot, 1.0)["spot_peak"] == 0


def test_week_factors_follow_the_traffic_curve():
    flat = TrafficSpec(duration_s=60, rate=10)
    assert week_factors(flat).tolist() == [1.0] * HOURS
    curved = TrafficSpec(duration_s=60, rate=10, diurnal={"trough": 0.25, "peak_hour": 14},
                         weekly=[1, 1, 1, 1, 1, 0.5, 0.5])
    f = week_factors(curved)
    assert f.max() == pytest.approx(1.0, abs=0.02) and 0.1 < f.min() < 0.3 and f[5 * 24 + 14] < 0.6


def test_plan_with_regions_and_capacity_answers_the_cheapest_mix_for_a_week(tmp_path, capsys):
    capacity = {"eu-west": {"reserved": {"gpu": "H100", "count": 8, "usd_per_hour": 2.2},
                            "on_demand": {"gpu": "H100", "count": 8, "usd_per_hour": 3.6},
                            "spot": {"gpu": "H100", "count": 8, "usd_per_hour": 1.4}},
                "eu-north": {"on_demand": {"gpu": "H100", "count": 8, "usd_per_hour": 6.88},
                             "spot": {"gpu": "H100", "count": 8, "usd_per_hour": 2.6}},
                "us-east": {"reserved": {"gpu": "H100", "count": 8, "usd_per_hour": 1.85},
                            "on_demand": {"gpu": "H100", "count": 8, "usd_per_hour": 2.99}}}
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(json.dumps(fleet_doc(capacity=capacity)))
    traffic = tmp_path / "traffic.yaml"
    traffic.write_text(json.dumps({"duration_s": 30, "rate": 30, "diurnal": {"trough": 0.25, "peak_hour": 14},
                                   "prompt_tokens": {"mean": 256}, "output_tokens": {"mean": 32},
                                   "regions": [{"name": r} for r in REGIONS], "rtt_s": RTT_S}))
    out = tmp_path / "plan.json"
    assert main(["plan", "--config", str(fleet), "--traffic", str(traffic), "--model-config", "llama-3.1-8b",
                 "--gpus", "H100", "--slo-ttft", "500ms", "--spare", "region", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    mix = res["capacity_mix"]
    assert mix["survives_region_loss"] is True and mix["met"] is True
    by = {r["region"]: r for r in mix["regions"]}
    assert set(by) == set(REGIONS)
    for r in by.values():
        assert r["reserved"] + r["on_demand_peak"] + r["spot_peak"] >= r["peak_replicas"] >= 1
    assert by["eu-north"]["reserved"] == 0  # it offers none
    assert by["us-east"]["spot_peak"] == 0  # it lists no spot: none offered
    assert by["eu-west"]["prices"]["spot"]["source"] == "fleet file"
    assert mix["usd_per_month"] == pytest.approx(mix["usd_per_week"] * 730 / 168, abs=0.05)
    assert mix["usd_per_week"] == pytest.approx(sum(r["usd_per_week"] for r in by.values()), abs=0.05)
    assert mix["usd_per_mtok"] > 0 and mix["checks"][-1]["preempted"] >= 0
    assert "capacity mix for a week" in text and "$/month" in text
    assert "survives the loss of any one region: yes" in text
    # The same fleet file drives `argosy sim`; a traffic region the fleet file lacks is one clear line.
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"duration_s": 5, "rate": 1, "regions": [{"name": "mars"}]}))
    assert main(["sim", "--config", str(fleet), "--traffic", str(bad), "--gpu", "H100",
                 "--model-config", "llama-3.1-8b"]) != 0
    assert "mars" in capsys.readouterr().err
