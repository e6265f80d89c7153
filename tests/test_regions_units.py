"""Regions without a network: the fleet file's regions, outlier detection with hold-down and ramp, the
region filters and scorers (home first, spill, failover, residency), and gateway-to-gateway signatures."""

from __future__ import annotations

import pytest

from argosy.config import FleetConfigError, parse_fleet
from argosy.config_regions import region_view
from argosy.gateway.errors import GatewayError
from argosy.gateway.regions.auth import RegionSigner, SecretError, load_secret
from argosy.gateway.regions.outlier import HOLDING, IN, OUT, RAMPING, RegionHealth
from argosy.gateway.regions.service import Regions
from argosy.gateway.router import RouteRequest

SECRET = "s" * 32


def regions_fleet(**extra) -> dict:
    return {"regions": [
        {"name": "eu-west", "provider": "gcp", "location": "europe-west4", "jurisdiction": "eu",
         "gateway": "http://10.0.0.1:8000",
         "capacity": {"reserved": {"gpu": "H100", "count": 8, "usd_per_hour": 1.85},
                      "spot": {"gpu": "H100", "count": 16, "usd_per_hour": 1.2}},
         "nodes": [{"name": "eu-a", "capacity": "reserved", "gpus": [{"model": "H100", "memory_gib": 80}]}],
         "upstreams": {"chat": ["http://127.0.0.1:9001"]}},
        {"name": "eu-north", "provider": "aws", "jurisdiction": "eu", "gateway": "http://10.0.0.2:8000"},
        {"name": "us-east", "provider": "coreweave", "jurisdiction": "us", "gateway": "http://10.0.0.3:8000"}],
        "models": [{"name": "chat", "upstreams": ["http://127.0.0.1:9000"],
                    "autoscaling": {"target": 4}},
                   {"name": "eu-only", "upstreams": ["http://127.0.0.1:9002"], "regions": ["eu-west", "eu-north"]}],
        "region_routing": {"hold_down_s": 10, "ramp_s": 10, "residency_header": "X-Argosy-Residency"},
        **extra}


def test_fleet_file_regions_and_cross_checks():
    fleet = parse_fleet(regions_fleet(keys=[{"name": "k", "hash": "x", "residency": "eu"}]))
    eu = fleet.regions[0]
    assert eu.capacity["spot"].usd_per_hour == 1.2 and eu.nodes[0].capacity == "reserved"
    assert fleet.region_routing.residency_header == "x-argosy-residency"
    view = region_view(fleet, "eu-west")
    assert view.gateway.region == "eu-west" and [n.name for n in view.nodes] == ["eu-a"]
    assert view.models[0].upstreams == ["http://127.0.0.1:9001"]  # the region's own upstreams
    us = region_view(fleet, "us-east")
    assert us.models[0].upstreams == ["http://127.0.0.1:9000"] and us.models[1].upstreams == []  # not run there
    bad = [({"keys": [{"name": "k", "hash": "x", "residency": "in"}]}, "keys.k.residency: 'in' is no region"),
           ({"gateway": {"region": "mars"}}, "gateway.region: 'mars' is not a region")]
    for extra, msg in bad:
        with pytest.raises(FleetConfigError, match=msg):
            parse_fleet(regions_fleet(**extra))
    doc = regions_fleet()
    doc["models"][1]["regions"] = ["eu-south"]
    with pytest.raises(FleetConfigError, match="models.eu-only.regions: 'eu-south' is not a region"):
        parse_fleet(doc)
    doc = regions_fleet()
    doc["regions"][0]["capacity"]["preemptible"] = {"gpu": "H100", "count": 1, "usd_per_hour": 1}
    with pytest.raises(FleetConfigError, match="capacity.preemptible"):
        parse_fleet(doc)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_outlier_detection_hold_down_and_ramp():
    clock = Clock()
    h = RegionHealth(3, stale_after_s=3, hold_down_s=10, ramp_s=10, clock=clock)
    assert h.share() == 0.0  # never heard from
    h.fail(at_once=True)  # unhealthy before it ever was in: still joins without a hold-down
    h.ok()
    assert h.state == IN and h.share() == 1.0  # joining needs no hold-down
    h.fail(), h.fail()
    assert h.share() == 1.0  # two failures: still in
    h.fail()
    assert h.state == OUT and h.share() == 0.0
    clock.t += 1
    h.ok()
    assert h.state == HOLDING and h.share() == 0.0
    clock.t += 9.9
    h.ok()
    assert h.share() == 0.0  # still held down
    clock.t += 2.6  # 2.5 s into the 10 s ramp
    h.ok()
    assert h.share() == pytest.approx(0.25, abs=0.02) and h.state == RAMPING
    h.fail(at_once=True)
    assert h.state == OUT  # a failure while ramping: out, the hold-down starts over
    clock.t += 1
    h.ok()
    clock.t += 10 + 10 + 0.1
    h.ok()
    assert h.share() == 1.0 and h.state == IN
    clock.t += 3.5  # nothing fresh for longer than stale_after_s
    assert h.share() == 0.0 and h.state == OUT


def make_regions(monkeypatch, here: str = "eu-west", **extra) -> Regions:
    monkeypatch.setenv("ARGOSY_REGION_SECRET", SECRET)
    fleet = region_view(parse_fleet(regions_fleet(**extra)), here)
    regions = Regions(fleet)
    for mr in regions.models.values():  # every other region reported healthy, 1 replica of 4 slots, idle
        for u in mr.candidates:
            u.health.ok()
            u.report(0, 4, 1.0, 2.0)
        mr.by_region["eu-north"].rtt_s, mr.by_region["us-east"].rtt_s = 0.02, 0.09
        mr.home.report(0, 4, 1.0, 2.0)
    return regions


def test_home_first_then_spill_to_the_nearest_then_failover(monkeypatch):
    regions = make_regions(monkeypatch)
    mr = regions.models["chat"]
    req = RouteRequest("hi", 1)
    assert regions.place("chat", req, None, True) == (None, "home")
    mr.home.report(4, 4, 1.0, 2.0)  # saturated: 4 in flight of 4
    target, why = regions.place("chat", req, None, True)
    assert (target.region, why) == ("eu-north", "spill")  # the nearest with room
    mr.by_region["eu-north"].report(4, 4, 1.0, 2.0)
    assert regions.place("chat", req, None, True)[0].region == "us-east"  # the next one with room
    mr.by_region["us-east"].report(4, 4, 1.0, 2.0)
    assert regions.place("chat", req, None, True) == (None, "home")  # all saturated: queue at home
    mr.home.report(0, 4, 1.0, 2.0)
    mr.by_region["eu-north"].report(0, 4, 1.0, 2.0)
    target, why = regions.place("chat", req, None, False)  # home has no live replica
    assert (target.region, why) == ("eu-north", "failover")
    # A forwarded request is served where it lands (one hop), whatever the load.
    mr.home.report(40, 4, 1.0, 2.0)
    assert regions.place("chat", req, object(), True) == (None, "forwarded_in")


def test_residency_is_never_broken_and_refused_when_its_regions_are_down(monkeypatch):
    regions = make_regions(monkeypatch, here="us-east")
    mr = regions.models["chat"]
    pinned = RouteRequest("hi", 1, residency="eu")
    target, why = regions.place("chat", pinned, None, True)
    assert target.jurisdiction == "eu" and why == "residency"  # arrived in the us: goes to the eu
    for name in ("eu-west", "eu-north"):
        mr.by_region[name].health.fail(at_once=True)
    with pytest.raises(GatewayError) as e:
        regions.place("chat", pinned, None, True)
    assert e.value.status == 503 and ("retry-after", "5") in [(k.decode(), v.decode()) for k, v in e.value.headers()]
    assert regions.place("chat", RouteRequest("hi", 1), None, True) == (None, "home")  # unpinned: served
    # A model that does not run here goes to a region that runs it.
    target, why = regions.place("eu-only", RouteRequest("hi", 1), None, True)
    assert why == "not_here" and target.region in ("eu-west", "eu-north")


def test_residency_header_narrows_never_widens(monkeypatch):
    regions = make_regions(monkeypatch)
    scope = {"headers": [(b"x-argosy-residency", b"EU")]}
    assert regions.residency(scope, None) == "eu"
    assert regions.residency({"headers": []}, "us") == "us"
    with pytest.raises(GatewayError, match="pinned to 'us'"):
        regions.residency(scope, "us")
    with pytest.raises(GatewayError, match="no region's jurisdiction"):
        regions.residency({"headers": [(b"x-argosy-residency", b"mars")]}, None)


def test_signatures_refuse_tampering_replays_and_old_calls(monkeypatch):
    now = [1000.0]
    a = RegionSigner("a", b"k" * 32, 30, clock=lambda: now[0])
    b = RegionSigner("b", b"k" * 32, 30, clock=lambda: now[0])
    h = a.sign("POST", "/v1/completions", b"{}", {"x-argosy-residency": "eu"})
    assert b.verify(h, "POST", "/v1/completions", b"{}") == "a"
    with pytest.raises(GatewayError, match="seen before"):
        b.verify(h, "POST", "/v1/completions", b"{}")
    h = a.sign("POST", "/v1/completions", b"{}", {"x-argosy-residency": "eu"})
    for headers, body in [({**h, "x-argosy-residency": "us"}, b"{}"), (h, b"{ }")]:
        with pytest.raises(GatewayError, match="bad signature"):
            b.verify(headers, "POST", "/v1/completions", body)
    other = RegionSigner("c", b"z" * 32, 30, clock=lambda: now[0])
    with pytest.raises(GatewayError, match="bad signature"):
        b.verify(other.sign("POST", "/x", b""), "POST", "/x", b"")
    old = a.sign("POST", "/x", b"")
    now[0] += 31
    with pytest.raises(GatewayError, match="clocks more than 30 s apart"):
        b.verify(old, "POST", "/x", b"")
    with pytest.raises(GatewayError, match="needs x-argosy-region"):
        b.verify({}, "POST", "/x", b"")
    monkeypatch.delenv("ARGOSY_REGION_SECRET", raising=False)
    with pytest.raises(SecretError, match="shared secret"):
        load_secret("ARGOSY_REGION_SECRET", None)
