"""SIGTERM (`podman stop`, Kubernetes): the gateway stops taking connections, lets a stream in flight
finish (within gateway.drain_timeout_s) and exits 0, not 143: an orchestrator reads a signal's exit
status as a failure."""

from __future__ import annotations

import threading
import time

import httpx

from tests.gateway_fixtures import start_gateway, start_upstream


def test_sigterm_drains_a_stream_then_exits_zero():
    up = start_upstream("slow", tokens=40, token_delay=0.15)  # a 6 s stream: longer than uvicorn's usual 5 s
    gw = start_gateway({"gateway": {"drain_timeout_s": 20}, "models": [{"name": "m", "upstreams": [up.url]}]})
    got: dict = {}
    try:
        assert httpx.get(gw.url + "/health", timeout=10).status_code == 200  # serving, not still starting
        started = threading.Event()

        def stream() -> None:
            body = {"model": "m", "prompt": "hi", "max_tokens": 40, "stream": True}
            try:
                with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=30) as r:
                    lines = []
                    for line in r.iter_lines():
                        lines.append(line)
                        started.set()
                    got["lines"] = lines
            except httpx.HTTPError as e:
                got["error"] = repr(e)
            started.set()

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(10)
        time.sleep(0.3)
        gw.popen.terminate()
        t.join(30)
        assert "error" not in got, got
        assert [x for x in got["lines"] if x][-1] == "data: [DONE]"  # the whole stream, after the SIGTERM
        assert gw.popen.wait(30) == 0
        assert "Traceback" not in gw.popen.stderr.read()
    finally:
        gw.stop()
        up.stop()
