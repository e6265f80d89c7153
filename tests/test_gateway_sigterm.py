"""SIGTERM (`podman stop`, Kubernetes) stops the gateway gracefully and it exits 0, not 143: an
orchestrator reads a signal's exit status as a failure."""

from __future__ import annotations

import httpx

from tests.gateway_fixtures import start_gateway, start_upstream


def test_sigterm_exits_zero_after_a_graceful_stop():
    up = start_upstream("u")
    gw = start_gateway({"models": [{"name": "m", "upstreams": [up.url]}]})
    try:
        assert httpx.get(gw.url + "/health", timeout=10).status_code == 200  # serving, not still starting
        gw.popen.terminate()
        assert gw.popen.wait(30) == 0
        assert "Traceback" not in gw.popen.stderr.read()
    finally:
        gw.stop()
        up.stop()
