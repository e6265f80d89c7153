"""`discover: HOST:PORT`: the gateway routes to every address the name resolves to (a Kubernetes
headless Service lists the ready replica pods), following it as addresses come and go."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from argosy.config import parse_fleet
from argosy.gateway.app import Gateway
from argosy.gateway.discovery import Discovery
from tests.gateway_fixtures import start_gateway, start_upstream


def test_a_gateway_routes_to_what_the_name_resolves_to():
    up = start_upstream("found")
    port = up.url.rsplit(":", 1)[1]
    gw = start_gateway({"gateway": {"health_interval_s": 0.2},
                        "models": [{"name": "m", "checkpoint": "/models/m", "discover": f"127.0.0.1:{port}"}]})
    try:
        for _ in range(50):  # the first lookup runs at start; the routing set fills then
            r = httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 4},
                           timeout=10)
            if r.status_code == 200:
                break
            asyncio.run(asyncio.sleep(0.1))
        assert r.status_code == 200, r.text
        assert up.stats()["requests"] >= 1
    finally:
        gw.stop()
        up.stop()


def test_addresses_that_come_and_go_join_and_leave_the_routing_set():
    fleet = parse_fleet({"models": [{"name": "m", "checkpoint": "/models/m", "discover": "replicas.ns.svc:8000"},
                                    {"name": "fixed", "upstreams": ["http://10.0.0.9:8000"]}]})
    gw = Gateway(fleet)
    answers: list = [{"http://10.0.0.1:8000", "http://10.0.0.2:8000"}, {"http://10.0.0.2:8000"},
                     socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
                     socket.gaierror(socket.EAI_NONAME, "Name or service not known")]

    async def resolver(host: str, port: int) -> set[str]:
        assert (host, port) == ("replicas.ns.svc", 8000)
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    d = Discovery(gw, 1.0, resolver)
    urls = lambda: sorted(u.url for u in gw.models["m"].upstreams())  # noqa: E731

    async def steps() -> list[list[str]]:
        seen = []
        for _ in range(4):
            await d.refresh()
            seen.append(urls())
        return seen

    seen = asyncio.run(steps())
    assert seen[0] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert seen[1] == ["http://10.0.0.2:8000"] and "http://10.0.0.1:8000" not in gw.reg.by_url
    assert seen[2] == ["http://10.0.0.2:8000"]  # a DNS outage keeps the set
    assert seen[3] == []  # no address at all: no ready replica
    assert [u.url for u in gw.models["fixed"].upstreams()] == ["http://10.0.0.9:8000"]


@pytest.mark.parametrize("bad", ["no-port", "host:http", "http://host:80", "host:0"])
def test_discover_must_be_host_and_port(bad):
    with pytest.raises(ValueError, match="discover"):
        parse_fleet({"models": [{"name": "m", "checkpoint": "/c", "discover": bad}]})
