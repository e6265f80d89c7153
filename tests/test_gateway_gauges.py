"""The gateway's gauges describe the state they name (issue 15, item 7): requests driven through a real
gateway (streamed and not, answered, refused, failed upstream, cut off by the client), then /metrics read
while some are in flight and after all have ended, against /admin/upstreams and the upstreams' own count.
(`argosy serve` with a real replica, the controller's series and `argosy status`: test_observe_fleet.py.)"""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import pytest

from tests.gateway_fixtures import start_gateway, start_upstream
from tests.server_fixtures import parse_metrics

pytestmark = pytest.mark.timeout(180)


def gauges(gw) -> dict[str, float]:
    return parse_metrics(httpx.get(gw.url + "/metrics", timeout=10).text)


def metric(samples: dict[str, float], name: str, **labels: str) -> float:
    """The one sample of `name` with exactly these labels; a missing series fails (it is not a 0)."""
    key = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    assert key in samples, f"{key} is not exported"
    return samples[key]


def upstream_states(gw) -> dict[str, dict]:
    models = httpx.get(gw.url + "/admin/upstreams", timeout=10).json()["models"]
    return {u["url"]: u for revs in models.values() for ups in revs.values() for u in ups}


def wait_for(what: str, cond, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


def test_every_gateway_gauge_matches_its_state_during_and_after_traffic():
    slow, flaky = start_upstream("slow", token_delay=0.05, tokens=40), start_upstream("flaky")
    gw = None
    try:
        gw = start_gateway({"gateway": {"health_interval_s": 0.2, "eject_after_failures": 100}, "models": [
            {"name": "chat", "upstreams": [slow.url], "admission": {"max_in_flight": 3, "max_queue": 2,
                                                                     "queue_timeout_s": 30}},
            {"name": "other", "upstreams": [flaky.url], "admission": {"max_in_flight": 4}}]})

        def complete(model: str, stream: bool, max_tokens: int = 40) -> int:
            body = {"model": model, "prompt": "hello", "max_tokens": max_tokens, "stream": stream}
            with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=60) as r:
                r.read()
                return r.status_code

        def cut_off() -> None:  # a client that reads one chunk of its stream, then hangs up
            body = {"model": "chat", "prompt": "hello", "max_tokens": 40, "stream": True}
            with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=60) as r:
                next(r.iter_raw())

        with cf.ThreadPoolExecutor(12) as ex:
            streams = [ex.submit(complete, "chat", True) for _ in range(3)]
            # While three 2-second streams hold every slot of "chat": what the gauges say is what is so.
            wait_for("three streams on the slow upstream", lambda: slow.stats()["in_flight"] == 3)
            queued = [ex.submit(complete, "chat", False) for _ in range(2)]
            wait_for("two queued", lambda: metric(gauges(gw), "argosy_gateway_queue_depth", model="chat") == 2)
            g = gauges(gw)
            assert metric(g, "argosy_gateway_in_flight", model="chat") == 3
            assert metric(g, "argosy_gateway_upstream_in_flight", upstream=slow.url) == 3
            assert upstream_states(gw)[slow.url]["in_flight"] == 3
            full = complete("chat", False)  # the queue (max_queue 2) is full: refused at once
            assert full == 503
            flaky.control(fail_status=500, fail_count=2)
            failed = [ex.submit(complete, "other", s, 4) for s in (True, False)]
            bad = httpx.post(gw.url + "/v1/completions", content=b"{not json", timeout=10)
            assert bad.status_code == 400
            codes = [f.result() for f in streams + queued] + sorted(f.result() for f in failed)
            assert codes == [200] * 5 + [503, 503], codes
            cut = [ex.submit(cut_off) for _ in range(2)]
            for f in cut:
                f.result()
            answered = [ex.submit(complete, "other", s, 4) for s in (True, False)]
            assert [f.result() for f in answered] == [200, 200]

        # All of it has ended (the cut-off streams once the gateway sees the client gone): every gauge is 0.
        wait_for("the upstreams to be idle", lambda: slow.stats()["in_flight"] == 0 == flaky.stats()["in_flight"])
        def settled() -> dict[str, float] | None:  # the gateway notices a cut-off client at its next chunk
            now = gauges(gw)
            return now if all(now.get(f'argosy_gateway_in_flight{{model="{m}"}}') == 0 for m in ("chat", "other")) \
                else None

        g = wait_for("in flight back to 0", settled, 10)
        for model in ("chat", "other"):
            assert metric(g, "argosy_gateway_in_flight", model=model) == 0, model
            assert metric(g, "argosy_gateway_queue_depth", model=model) == 0, model
        states = upstream_states(gw)
        for url in (slow.url, flaky.url):
            assert metric(g, "argosy_gateway_upstream_in_flight", upstream=url) == 0 == states[url]["in_flight"]
            assert metric(g, "argosy_gateway_upstream_healthy", upstream=url) == (states[url]["state"] == "closed")
    finally:
        if gw:
            gw.stop()
        slow.kill()  # it still sleeps through the answers nobody reads
        flaky.stop()


def test_a_client_that_leaves_before_its_answer_frees_its_slot_and_queue_place_at_once():
    """A non-streamed request whose client hung up kept its admission slot (and the upstream generating for
    nobody) until the answer was done, and a queued one kept its queue place until its turn or the queue
    timeout: clients that connect, send and leave filled the queue, and everyone else got 503 queue_full."""
    slow = start_upstream("slow", token_delay=0.5, tokens=40)  # a non-streamed answer: 20 s
    gw = None
    try:
        gw = start_gateway({"models": [{"name": "m", "upstreams": [slow.url], "admission": {
            "max_in_flight": 1, "max_queue": 2, "queue_timeout_s": 60}}]})

        def leave_after(seconds: float) -> None:
            with pytest.raises(httpx.TimeoutException):
                httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 40},
                           timeout=seconds)

        def depth() -> tuple[float, float]:
            g = gauges(gw)
            return metric(g, "argosy_gateway_in_flight", model="m"), metric(g, "argosy_gateway_queue_depth", model="m")

        with cf.ThreadPoolExecutor(4) as ex:
            left = [ex.submit(leave_after, 2.0) for _ in range(3)]  # one takes the slot, two queue
            wait_for("one in flight, two queued", lambda: depth() == (1, 2), 5)
            for f in left:
                f.result()
        wait_for("the slot and the queue freed", lambda: depth() == (0, 0), 3)
        r = httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 1}, timeout=10)
        assert r.status_code == 200, r.text
    finally:
        if gw:
            gw.stop()
        slow.kill()  # it still sleeps through the answers nobody reads


def test_a_client_that_leaves_a_request_sent_to_another_region_frees_it_there():
    """A model served only in region b, asked through region a's gateway: a forwarded non-streamed request
    whose client hung up had kept a's call to b open until b's answer was done, and with it b's admission
    slot and its replica generating for nobody."""
    import socket

    def free_port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    slow = start_upstream("slow", token_delay=0.5, tokens=40)  # a non-streamed answer: 20 s
    ports = {"a": free_port(), "b": free_port()}
    fleet = {"regions": [{"name": r, "provider": "onprem", "jurisdiction": "eu",
                          "gateway": f"http://127.0.0.1:{ports[r]}"} for r in ("a", "b")],
             "region_routing": {"exchange_interval_s": 0.3, "stale_after_s": 3.0},
             "models": [{"name": "m", "regions": ["b"], "upstreams": [slow.url]}]}
    fleet["regions"][1]["upstreams"] = {"m": [slow.url]}
    env = {"ARGOSY_REGION_SECRET": "r" * 32}
    gws = {}
    try:
        for r in ("b", "a"):
            gws[r] = start_gateway(fleet, "--region", r, "--port", str(ports[r]), env=env)

        def b_in_flight() -> float:
            return metric(gauges(gws["b"]), "argosy_gateway_in_flight", model="m")

        wait_for("region a to see b serving m", lambda: any(
            u["state"] == "in" for u in httpx.get(gws["a"].url + "/admin/regions").json()["models"]["m"]), 20)

        def leave_after(seconds: float) -> None:
            with pytest.raises(httpx.TimeoutException):
                httpx.post(gws["a"].url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 40},
                           timeout=seconds)

        with cf.ThreadPoolExecutor(1) as ex:
            left = ex.submit(leave_after, 3.0)
            wait_for("b serving the request a forwarded", lambda: b_in_flight() == 1, 3)
            left.result()
        wait_for("b's slot freed", lambda: b_in_flight() == 0, 3)
    finally:
        for gw in gws.values():
            gw.stop()
        slow.kill()  # it still sleeps through the answer nobody reads


def test_a_stream_whose_client_leaves_before_its_first_token_frees_its_slot_at_once():
    """A long prefill (or the replica's queue): the stream's first chunk is 20 s away. Its client had been
    noticed gone only when that chunk came, holding the slot and the upstream request until then."""
    slow = start_upstream("slow", ttft=20, tokens=4)
    gw = None
    try:
        gw = start_gateway({"models": [{"name": "m", "upstreams": [slow.url], "admission": {"max_in_flight": 1}}]})
        with pytest.raises(httpx.TimeoutException):
            with httpx.stream("POST", gw.url + "/v1/completions", timeout=1.5,
                              json={"model": "m", "prompt": "hi", "max_tokens": 4, "stream": True}) as r:
                r.read()
        wait_for("the slot freed", lambda: metric(gauges(gw), "argosy_gateway_in_flight", model="m") == 0, 3)
    finally:
        if gw:
            gw.stop()
        slow.kill()  # it still sleeps towards the first token nobody reads


def test_a_stream_its_client_leaves_midway_is_counted_499_not_200():
    """argosy_gateway_requests_total counted a stream whose client left after its first tokens as a 200 served
    (a non-streamed request left the same way was a 499)."""
    slow = start_upstream("trickle", token_delay=0.5, tokens=40)
    gw = None
    try:
        gw = start_gateway({"models": [{"name": "m", "upstreams": [slow.url]}]})
        with httpx.stream("POST", gw.url + "/v1/completions", timeout=30,
                          json={"model": "m", "prompt": "hi", "max_tokens": 40, "stream": True}) as r:
            next(r.iter_bytes())  # the first chunk, then the client hangs up
        counted = lambda status: sum(v for k, v in gauges(gw).items()  # noqa: E731
                                     if k.startswith("argosy_gateway_requests_total{") and f'status="{status}"' in k)
        wait_for("the stream counted", lambda: counted(499) == 1, 10)
        assert counted(200) == 0
        wait_for("the slot freed", lambda: metric(gauges(gw), "argosy_gateway_in_flight", model="m") == 0, 3)
    finally:
        if gw:
            gw.stop()
        slow.kill()
