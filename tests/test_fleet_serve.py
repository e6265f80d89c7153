"""`argosy serve` end to end with real `argosy engine` replicas: panic scale-up under load, drain and
scale to zero when it stops, a cold start that serves the first request, a killed replica replaced
with no request lost, and Ctrl-C leaving no process behind. One serve process, phases in order."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import openai
import pytest

from tests.fleet_fixtures import Serve, engine_pids, ready, tiny_fleet
from tests.server_fixtures import metric, parse_metrics

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from argosy.engine.random_model import make_random_model

    return str(make_random_model(tmp_path_factory.mktemp("fleet-tiny"), init_std=0.2))


@pytest.fixture(scope="module")
def serve(ckpt):
    s = Serve(tiny_fleet(ckpt, scale_to_zero_after_s=5))
    yield s
    s.stop()


class Load:
    """Client threads sending requests until stopped; every outcome is recorded."""

    def __init__(self, url: str, workers: int, stream: bool, max_tokens: int):
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        self.stop_ev = threading.Event()
        self.ok = self.refused = 0
        self.bad: list[str] = []
        self.threads = [threading.Thread(target=self.run, args=(stream, max_tokens), daemon=True)
                        for _ in range(workers)]
        for t in self.threads:
            t.start()

    def one(self, stream: bool, max_tokens: int) -> None:
        args = dict(model="tiny", prompt="Once upon a time", max_tokens=max_tokens,
                    extra_body={"ignore_eos": True})
        try:
            if stream:
                chunks = list(self.client.completions.create(stream=True, **args))
                finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
                assert finish == ["length"], f"stream cut: {len(chunks)} chunks, finish {finish}"
            else:
                r = self.client.completions.create(**args)
                assert r.choices[0].finish_reason == "length"
            self.ok += 1
        except openai.APIStatusError as e:  # a clean refusal: an HTTP error with an OpenAI error body
            if e.status_code in (429, 503) and isinstance(e.body, dict):
                self.refused += 1
            else:
                self.bad.append(f"{e.status_code}: {e.body}")
        except Exception as e:  # noqa: BLE001 - anything else is a lost request
            self.bad.append(f"{type(e).__name__}: {e}")

    def run(self, stream: bool, max_tokens: int) -> None:
        while not self.stop_ev.is_set():
            self.one(stream, max_tokens)

    def stop(self) -> None:
        self.stop_ev.set()
        for t in self.threads:
            t.join(120)


def test_load_panics_and_adds_replicas(serve):
    serve.wait_for("the first replica", lambda st: len(ready(st)) == 1)
    load = Load(serve.url, workers=4, stream=True, max_tokens=48)
    try:
        st = serve.wait_for("a second ready replica", lambda st: len(ready(st)) == 2)
        time.sleep(1.0)  # some requests on both
    finally:
        load.stop()
    print(f"  load: {load.ok} answered, {load.refused} refused, {len(load.bad)} lost")
    assert load.bad == [] and load.ok > 0
    assert any(d["panic"] and d["direction"] == "up" for d in st["decisions"]) or any(
        '"panic": true' in line for line in serve.lines)
    m = parse_metrics(httpx.get(serve.url + "/metrics").text)
    assert metric(m, "argosy_fleet_scaling_decisions_total", model="tiny", direction="up") >= 1
    assert metric(m, "argosy_fleet_cold_start_seconds_count", model="tiny") >= 2


def test_idle_drains_down_to_zero(serve):
    serve.wait_for("zero replicas", lambda st: not st["replicas"], timeout=60)
    m = parse_metrics(httpx.get(serve.url + "/metrics").text)
    assert metric(m, "argosy_fleet_scaling_decisions_total", model="tiny", direction="down") >= 1
    assert metric(m, "argosy_fleet_desired_replicas", model="tiny") == 0
    assert any('"event": "replica_drained"' in line for line in serve.lines)


def test_first_request_after_zero_waits_for_the_cold_start(serve):
    client = openai.OpenAI(base_url=serve.url + "/v1", api_key="none", max_retries=0, timeout=120)
    t0 = time.monotonic()
    r = client.completions.create(model="tiny", prompt="Hello", max_tokens=8)
    took = time.monotonic() - t0
    print(f"  first request after zero: {took:.1f} s (cold start included)")
    assert r.choices[0].text and took > 0.5
    m = parse_metrics(httpx.get(serve.url + "/metrics").text)
    assert metric(m, "argosy_fleet_cold_start_seconds_count", model="tiny") >= 3


def test_a_killed_replica_is_replaced_and_no_request_is_lost(serve, ckpt):
    st = serve.wait_for("one ready replica", lambda st: len(ready(st)) >= 1)
    victim = ready(st)[0]
    load = Load(serve.url, workers=2, stream=False, max_tokens=16)
    try:
        time.sleep(1.0)
        pids = engine_pids(ckpt)
        port = victim["url"].rsplit(":", 1)[1]
        killed = [p for p in pids if port in open(f"/proc/{p}/cmdline").read() or _listens(p, int(port))]
        assert killed, f"no process found for {victim['url']} among {pids}"
        for p in killed:
            os.kill(p, signal.SIGKILL)
        serve.wait_for("a replacement", lambda st: any(r["id"] != victim["id"] for r in ready(st)))
        time.sleep(1.0)
    finally:
        load.stop()
    print(f"  load: {load.ok} answered, {load.refused} refused, {len(load.bad)} lost")
    assert load.bad == [] and load.ok > 0
    assert any('"event": "replica_failed"' in line for line in serve.lines)


def _listens(pid: int, port: int) -> bool:
    """Whether the process holds a listening socket on this port (via /proc/net/tcp inodes)."""
    hexport = f":{port:04X}"
    inodes = {ln.split()[9] for ln in open("/proc/net/tcp").read().splitlines()[1:]
              if ln.split()[1].endswith(hexport) and ln.split()[3] == "0A"}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


def test_ctrl_c_leaves_no_process_behind(serve, ckpt):
    assert engine_pids(ckpt), "expected live replicas before Ctrl-C"
    rc = serve.stop(signal.SIGINT)
    assert rc in (0, 130, -signal.SIGINT), serve.lines[-20:]
    deadline = time.monotonic() + 10
    while engine_pids(ckpt) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert engine_pids(ckpt) == []
    assert any("argosy serve: stopped" in line for line in serve.lines)


def test_a_second_ctrl_c_ends_at_once_with_no_traceback_and_no_process_behind(ckpt):
    s = Serve(tiny_fleet(ckpt, min_replicas=1, max_replicas=1))
    try:
        s.wait_for("a replica", lambda st: len(ready(st)) == 1)
        assert engine_pids(ckpt)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        rc = s.stop(signal.SIGINT)  # the second, before the shutdown began: replicas are SIGKILLed at exit
        assert rc in (130, -signal.SIGINT) and time.monotonic() - t0 < 5, (rc, s.lines[-20:])
        deadline = time.monotonic() + 5
        while engine_pids(ckpt) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert engine_pids(ckpt) == []
        # had been uvicorn's "Exception in 'lifespan' protocol" error with the CancelledError's traceback
        assert not [line for line in s.lines if "Traceback" in line or '"level": "error"' in line], s.lines[-20:]
    finally:
        s.stop()


def test_a_replica_killed_by_a_signal_is_reported_as_such(ckpt):
    # The failure's detail had been only the replica's last output line, "argosy engine: ready, serving ...",
    # in `argosy status` and the replica_failed log: nothing said it was killed (an OOM kill looks the same).
    s = Serve(tiny_fleet(ckpt, min_replicas=1, max_replicas=1))
    try:
        victim = ready(s.wait_for("a replica", lambda st: len(ready(st)) == 1))[0]
        pids = engine_pids(ckpt)
        assert len(pids) == 1
        os.kill(pids[0], signal.SIGKILL)
        st = s.wait_for("the failure and a replacement", lambda st: st["recent_failures"]
                        and any(r["id"] != victim["id"] for r in ready(st)))
        assert "exited (killed by SIGKILL): " in st["recent_failures"][0]["detail"], st["recent_failures"]
    finally:
        s.stop()
