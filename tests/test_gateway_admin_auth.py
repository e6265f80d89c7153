"""Admin endpoints and replica URLs beyond loopback (issue 15, item 4): a gateway that listens on anything
but loopback answers /admin/*, /metrics/targets and /dashboard/data only with the admin key, whatever
else is set (no keys and `--insecure` included); on loopback with no keys they stay open as before.

The gateway decides from the address it listens on (`gateway.host`, which `--host` overrides). The
in-process gateways below are told 0.0.0.0 but served on a 127.0.0.1 socket: nothing listens beyond
this machine during the test.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from argosy.config import parse_fleet
from argosy.gateway.app import Gateway
from argosy.gateway.keys import new_key
from tests.gateway_fixtures import ROOT, start_upstream
from tests.test_observe_tracing import ThreadServer

pytestmark = pytest.mark.timeout(120)
OTHER = "http://127.0.0.1:9"  # an upstream an attacker would like the model's traffic (and prompts) to go to


@pytest.fixture(scope="module")
def upstream():
    up = start_upstream("u")
    yield up
    up.stop()


def serve(upstream, host: str, admin_hash: str | None = None) -> ThreadServer:
    cfg = {"gateway": {"host": host}, "models": [{"name": "m", "upstreams": [upstream.url]}]}
    if admin_hash:
        cfg["admin_key_hash"] = admin_hash
    return ThreadServer(Gateway(parse_fleet(cfg, "test")))


def urls_of(server: ThreadServer, headers: dict | None = None) -> list[str]:
    up = httpx.get(server.url + "/admin/upstreams", headers=headers, timeout=10).json()["models"]["m"]
    return [u["url"] for rev in up.values() for u in rev]


def test_beyond_loopback_with_no_admin_key_admin_and_replica_urls_are_closed(upstream):
    s = serve(upstream, "0.0.0.0")  # what `--host 0.0.0.0 --insecure` with no keys gives
    try:
        for method, path, body in (("GET", "/admin/upstreams", None), ("POST", "/admin/upstreams",
                                   {"model": "m", "url": OTHER}), ("DELETE", "/admin/upstreams",
                                   {"model": "m", "url": upstream.url}), ("GET", "/admin/keys", None),
                                   ("POST", "/admin/keys", {"name": "mine"}), ("DELETE", "/admin/keys/x", None),
                                   ("GET", "/metrics/targets", None), ("GET", "/dashboard/data", None)):
            r = httpx.request(method, s.url + path, json=body, timeout=10)
            assert r.status_code == 403, (method, path, r.status_code, r.text)
            assert r.json()["error"]["code"] == "admin_disabled"
            assert upstream.url.removeprefix("http://") not in r.text
        for path in ("/dashboard", "/health", "/metrics", "/v1/models"):  # the page and the rest stay open
            assert httpx.get(s.url + path, timeout=10).status_code == 200, path
        r = httpx.post(s.url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2}, timeout=10)
        assert r.status_code == 200 and r.json()["system_fingerprint"] == "u"  # still routed where it was
    finally:
        s.stop()


def test_beyond_loopback_the_admin_key_opens_them(upstream):
    key, h = new_key()
    s = serve(upstream, "0.0.0.0", h)
    adm = {"authorization": f"Bearer {key}"}
    try:
        for path in ("/admin/upstreams", "/metrics/targets", "/dashboard/data"):
            assert httpx.get(s.url + path, timeout=10).status_code == 401, path
            assert httpx.get(s.url + path, headers={"authorization": "Bearer sk-argosy-x-y"},
                             timeout=10).status_code == 401, path
            assert httpx.get(s.url + path, headers=adm, timeout=10).status_code == 200, path
        targets = httpx.get(s.url + "/metrics/targets", headers=adm, timeout=10).json()
        assert [t["targets"] for t in targets] == [[upstream.url.removeprefix("http://")]]
        assert httpx.post(s.url + "/admin/upstreams", json={"model": "m", "url": OTHER}, headers=adm,
                          timeout=10).status_code == 200
        assert OTHER in urls_of(s, adm)
    finally:
        s.stop()


def test_on_loopback_with_no_keys_they_stay_open(upstream):
    s = serve(upstream, "127.0.0.1")
    try:
        for path in ("/admin/upstreams", "/metrics/targets", "/dashboard/data"):
            assert httpx.get(s.url + path, timeout=10).status_code == 200, path
        assert urls_of(s) == [upstream.url]
    finally:
        s.stop()


def test_the_address_given_on_the_command_line_is_the_one_the_gateway_judges():
    # In a subprocess: bind() also sets up logging, for the whole process.
    code = """
import argparse
from argosy.config import parse_fleet
from argosy.gateway.app import Gateway
from argosy.gateway.cli import bind
fleet = parse_fleet({"gateway": {"host": "0.0.0.0", "port": 0}}, "test")
args = argparse.Namespace(host="127.0.0.1", port=0, insecure=False, log_format="text", log_level="warning",
                          log_requests=False, otlp_endpoint=None, config=None)
sock, _ = bind(fleet, args, "argosy gateway")
sock.close()
print(fleet.gateway.host, Gateway(fleet).loopback_only)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.split() == ["127.0.0.1", "True"], out.stderr
    assert not Gateway(parse_fleet({"gateway": {"host": "::"}}, "test")).loopback_only
    assert not Gateway(parse_fleet({"gateway": {"host": "gateway.example"}}, "test")).loopback_only
    assert Gateway(parse_fleet({"gateway": {"host": "::1"}}, "test")).loopback_only


def test_on_loopback_with_no_keys_web_pages_cannot_use_them(upstream):
    """Open admin endpoints take no credential: a web page the operator visited could POST /admin/upstreams
    (text/plain needs no CORS preflight) and have the model's prompts sent to its own server, or rebind its
    name to 127.0.0.1. A request naming another page (Origin) or another host (Host) is refused."""
    s = serve(upstream, "127.0.0.1")
    own = s.url.removeprefix("http://")
    try:
        for headers in ({"origin": "http://evil.example", "content-type": "text/plain"},
                        {"origin": "null"},
                        {"origin": "http://127.0.0.1:1"},  # another local page
                        {"host": "evil.example:" + own.rsplit(":", 1)[1], "origin": "http://evil.example"}):
            r = httpx.post(s.url + "/admin/upstreams", content=f'{{"model": "m", "url": "{OTHER}"}}',
                           headers=headers, timeout=10)
            assert r.status_code == 403, (headers, r.text)
            assert r.json()["error"]["code"] == "admin_cross_origin"
        assert urls_of(s) == [upstream.url]
        r = httpx.post(s.url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2}, timeout=10)
        assert r.json()["system_fingerprint"] == "u"  # still routed where it was
        # The gateway's own pages, and clients that are no browser (no Origin), still may.
        assert urls_of(s, {"origin": "http://" + own}) == [upstream.url]
        assert httpx.post(s.url + "/admin/upstreams", json={"model": "m", "url": OTHER}, timeout=10).status_code == 200
        assert OTHER in urls_of(s)
    finally:
        s.stop()


def test_on_loopback_with_no_keys_web_pages_cannot_spend_the_model(upstream):
    """Without keys the model routes need no credential either: a page the operator visits could POST
    text/plain to /v1/completions (no CORS preflight) and spend the machine's model, or rebind its name to
    127.0.0.1 and read the answers (a browser names the page in Origin on every POST). Clients that are no
    browser send no Origin and are served, whatever Host they name; so is the gateway's own page."""
    s = serve(upstream, "127.0.0.1")
    own = s.url.removeprefix("http://")
    body = '{"model": "m", "prompt": "hi", "max_tokens": 2}'
    try:
        for headers in ({"origin": "http://evil.example", "content-type": "text/plain"},
                        {"origin": "null", "content-type": "application/x-www-form-urlencoded"},
                        {"host": "evil.example:" + own.rsplit(":", 1)[1], "origin": "http://evil.example"}):
            for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
                r = httpx.request(method, s.url + path, content=body if method == "POST" else None, headers=headers,
                                  timeout=10)
                assert r.status_code == 403, (headers, path, r.text)
                assert r.json()["error"]["code"] == "cross_origin"
        r = httpx.post(s.url + "/v1/completions", content=body, headers={"origin": "http://" + own}, timeout=10)
        assert r.status_code == 200 and r.json()["system_fingerprint"] == "u"
        assert httpx.post(s.url + "/v1/completions", content=body, timeout=10).status_code == 200
        assert httpx.post(s.url + "/v1/completions", content=body, headers={"host": "proxy.internal"},
                          timeout=10).status_code == 200
    finally:
        s.stop()


@pytest.mark.parametrize("with_keys", [False, True])
def test_on_loopback_a_rebound_web_page_cannot_read_the_operator_routes(upstream, with_keys):
    """/dashboard/data (key names, their spend, replica URLs) and /metrics/targets are open to this machine on
    loopback. A page that rebinds its name to 127.0.0.1 is same-origin to them: its GET carries no Origin, only
    the page's name in Host. It read them; now 403, while this machine's own clients (the dashboard, Prometheus)
    still read them."""
    cfg = {"gateway": {"host": "127.0.0.1"}, "models": [{"name": "m", "upstreams": [upstream.url]}]}
    if with_keys:
        from tests.gateway_fixtures import pepper_for_tests

        cfg["keys"] = [{"name": "team", "hash": new_key(pepper_for_tests())[1]}]
    s = ThreadServer(Gateway(parse_fleet(cfg, "test")))
    port = s.url.rsplit(":", 1)[1]
    try:
        for path in ("/dashboard/data", "/metrics/targets"):
            r = httpx.get(s.url + path, headers={"host": f"rebound.example:{port}"}, timeout=10)
            assert (r.status_code, r.json()["error"]["code"]) == (403, "cross_origin"), (path, r.text)
            for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
                assert httpx.get(s.url + path, headers={"host": host}, timeout=10).status_code == 200, (path, host)
    finally:
        s.stop()
