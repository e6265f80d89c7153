"""Observability against one running `argosy serve` (a real replica): every series follows the naming
scheme and is documented; a real Prometheus scrapes gateway, controller and replicas (found through
/metrics/targets); the dashboard renders live data in headless Chromium; once traffic ends, every gauge
agrees with `argosy status` and the replica."""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.fleet_fixtures import ROOT, Serve, ready, tiny_fleet

pytestmark = pytest.mark.timeout(180)
SCHEME = re.compile(r"^(argosy_gateway_[a-z0-9_]+|argosy_fleet_[a-z0-9_]+|argosy_rollout_[a-z0-9_]+|vllm:[a-z0-9_]+"
                    r"|argosy_(gpu|host)_[a-z0-9_]+|DCGM_FI_DEV_[A-Z0-9_]+)$")
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def documented() -> dict[str, tuple[str, set[str]]]:
    """docs/metrics.md's tables: series -> (type, labels)."""
    out = {}
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0].startswith("`") and cells[1] in ("counter", "gauge", "histogram"):
            out[cells[0].strip("`")] = (cells[1], set(re.findall(r"`(\w+)`", cells[2])))
    return out


def scraped(text: str) -> dict[str, tuple[str, set[str]]]:
    out = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name  # the parser drops _total
        labels = {k for s in fam.samples for k in s.labels if k != "le"}
        out[name] = (fam.type, labels)
    return out


class Load:
    """Streaming completions from two threads until stopped."""

    def __init__(self, url: str):
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        self.done, self.ok = threading.Event(), 0
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(2)]
        for t in self.threads:
            t.start()

    def run(self) -> None:
        while not self.done.is_set():
            list(self.client.completions.create(model="tiny", prompt="It is a truth", max_tokens=12, stream=True,
                                                extra_body={"ignore_eos": True}))
            self.ok += 1

    def stop(self) -> None:
        self.done.set()
        for t in self.threads:
            t.join(60)


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    from argosy.engine.random_model import make_random_model

    ckpt = str(make_random_model(tmp_path_factory.mktemp("observe-tiny"), init_std=0.2))
    s = Serve(tiny_fleet(ckpt, max_replicas=1))
    try:
        s.wait_for("a ready replica", lambda st: len(ready(st)) == 1)
        load = Load(s.url)
        try:
            for _ in range(3):  # the dashboard's history: a sample per poll, at most one a second
                time.sleep(1.1)
                assert httpx.get(s.url + "/dashboard/data", timeout=10).status_code == 200
        finally:
            load.stop()
        assert load.ok > 0
        yield s
    finally:
        s.stop()


def test_every_series_follows_the_scheme_and_is_documented(serve):
    docs = documented()
    target = httpx.get(serve.url + "/metrics/targets", timeout=10).json()
    replica_url = "http://" + target[0]["targets"][0]
    series = {**scraped(httpx.get(serve.url + "/metrics", timeout=10).text),
              **scraped(httpx.get(replica_url + "/metrics", timeout=10).text)}
    for name, (kind, labels) in series.items():
        assert SCHEME.match(name), (f"{name}: not argosy_gateway_*, argosy_fleet_*, argosy_rollout_*, vllm:* or a "
                                    "device's series")
        assert not name.endswith("_created"), name
        if not name.startswith("DCGM_"):  # dcgm-exporter's own names are kept as they are
            assert (kind == "counter") == name.endswith("_total"), f"{name}: counters and only counters end in _total"
        if kind == "histogram":
            assert name.endswith(("_seconds", "_bytes")), f"{name}: a histogram names its unit"
        assert name in docs, f"{name} is not in docs/metrics.md"
        assert docs[name][0] == kind, f"{name}: docs say {docs[name][0]}, /metrics says {kind}"
        if labels:  # a labelled series with no value yet shows no labels
            assert labels == docs[name][1], f"{name}: labels {sorted(labels)}, documented {sorted(docs[name][1])}"
    for name in ("argosy_gateway_requests_total", "argosy_gateway_ttft_seconds", "argosy_fleet_desired_replicas",
                 "argosy_fleet_actual_replicas", "argosy_fleet_replicas", "argosy_fleet_scaling_decisions_total",
                 "argosy_fleet_cold_start_seconds", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds"):
        assert name in series and series[name][1], f"{name} has no samples on a fleet that served requests"
    assert {"argosy_host_cpu_usage_perc", "argosy_host_replica_resident_bytes"} <= series.keys()  # no labels
    samples = [s for fam in text_string_to_metric_families(httpx.get(serve.url + "/metrics", timeout=10).text)
               for s in fam.samples]
    assert {s.labels.get("key_class") for s in samples if s.name == "argosy_gateway_requests_total"} == {"none"}
    assert any(s.labels["direction"] == "up" and s.labels["reason"] == "stable" and s.value >= 1 for s in samples
               if s.name == "argosy_fleet_scaling_decisions_total")


def test_real_prometheus_scrapes_gateway_controller_and_replicas(serve, tmp_path):
    st = serve.fleet()
    sd = httpx.get(serve.url + "/metrics/targets", timeout=10).json()
    assert [g["labels"]["replica"] for g in sd] == [r["id"] for r in ready(st)]
    assert sd[0]["targets"] == [ready(st)[0]["url"].removeprefix("http://")]
    if shutil.which("prometheus") is None:
        pytest.skip("the prometheus binary is absent (Debian: apt-get install prometheus; .ci/run installs it)")
    host = serve.url.removeprefix("http://")
    cfg = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    cfg["rule_files"] = [str(ROOT / "deploy/prometheus/alerts.yml")]
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    jobs["argosy-gateway"]["static_configs"] = [{"targets": [host]}]
    jobs["argosy-replicas"]["http_sd_configs"] = [{"url": serve.url + "/metrics/targets", "refresh_interval": "1s"}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--web.listen-address=127.0.0.1:{port}", f"--storage.tsdb.path={tmp_path / 'data'}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))
    api = f"http://127.0.0.1:{port}/api/v1"
    want = {"gateway": "argosy_gateway_requests_total", "controller": "argosy_fleet_actual_replicas",
            "replica": 'vllm:generation_tokens_total{job="argosy-replicas"}'}
    got: dict[str, list] = {}
    try:
        t0 = time.monotonic()
        while len(got) < len(want):
            assert time.monotonic() - t0 < 45, f"Prometheus found only {sorted(got)}:\n" + \
                (tmp_path / "prometheus.log").read_text()[-2000:]
            for part, q in want.items():
                if part not in got:
                    try:
                        res = httpx.get(api + "/query", params={"query": q}, timeout=5).json()["data"]["result"]
                    except (httpx.HTTPError, ValueError, KeyError):
                        res = []
                    if res:
                        got[part] = res
            time.sleep(0.5)
        print(f"  Prometheus had all three parts after {time.monotonic() - t0:.1f} s")
        assert got["controller"][0]["metric"]["model"] == "tiny" and float(got["controller"][0]["value"][1]) == 1
        assert got["replica"][0]["metric"]["replica"] == ready(st)[0]["id"]
        assert float(got["gateway"][0]["value"][1]) > 0
        groups = httpx.get(api + "/rules", timeout=5).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert len(rules) >= 10 and {r["health"] for r in rules} <= {"ok", "unknown"}, rules
    finally:
        prom.terminate()
        prom.wait(30)


def test_dashboard_renders_live_data_in_headless_chromium(serve, tmp_path):
    d = httpx.get(serve.url + "/dashboard/data", timeout=10).json()
    rate = d["series"]["requests_per_s"]["tiny"]
    assert len(d["t"]) == len(rate) >= 3 and max(x or 0 for x in rate) > 0
    assert any(x for x in d["series"]["ttft_p99_s"]["tiny"])
    assert d["models"][0]["replicas"][0]["state"] == "ready"
    assert d["models"][0]["replicas"][0]["kv_cache_usage"] is not None
    assert 0 < d["models"][0]["replicas"][0]["device_memory"] < 1
    assert any(x["direction"] == "up" for x in d["decisions"])
    r = httpx.get(serve.url + "/dashboard/nope.js", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    if CHROMIUM is None:
        pytest.skip("no chromium binary (Debian: apt-get install chromium; .ci/run installs it)")
    load = Load(serve.url)  # live data while the page polls
    try:
        dom = chromium(serve.url + "/dashboard", tmp_path, "--dump-dom")
        shot = tmp_path / "dashboard.png"
        chromium(serve.url + "/dashboard", tmp_path, f"--screenshot={shot}", "--window-size=1400,1250")
    finally:
        load.stop()
    polls = int(re.search(r'<body data-polls="(\d+)"', dom).group(1))
    assert polls >= 2, "the page did not poll again without a reload"
    charts = {m.group(1): dict(re.findall(r'data-(\w+)="([^"]*)"', m.group(0)))
              for m in re.finditer(r'<div class="chart" data-chart="(\w+)"[^>]*>', dom)}
    for name in ("requests_per_s", "ttft", "itl", "queue_depth", "kv_cache_usage", "replicas", "device_busy",
                 "device_memory"):  # a CPU replica's device is its host
        assert int(charts[name]["points"]) >= 3, (name, charts[name])
    for name in ("requests_per_s", "ttft", "itl", "replicas"):
        assert charts[name]["nonzero"] == "true", (name, charts[name])
    assert charts["replicas"]["series"] == "2" and "errors_per_s" in charts
    assert dom.count("<canvas") >= 6 and ">ready<" in dom
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def chromium(url: str, tmp: Path, *args: str) -> str:
    # virtual time: the page's 2 s timers run ahead of the clock; the budget covers several polls
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
           f"--user-data-dir={tmp / 'chromium'}", "--virtual-time-budget=7000", *args, url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_every_gauge_agrees_with_argosy_status_and_the_replica_once_traffic_ends(serve):
    """Issue 15, item 7: after streamed and whole requests, one cut off by its client and two refused (by the
    gateway and by the replica), each gauge the gateway, the controller and the replica export describes
    the state it names, as `argosy status` and the replica itself see it."""
    client = openai.OpenAI(base_url=serve.url + "/v1", api_key="none", max_retries=0, timeout=60)
    args = dict(model="tiny", prompt="It is a truth", max_tokens=12, extra_body={"ignore_eos": True})

    def cut_off() -> None:  # reads the first chunk of a long stream, then hangs up
        body = {"model": "tiny", "prompt": "Once", "max_tokens": 200, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", serve.url + "/v1/completions", json=body, timeout=60) as r:
            next(r.iter_raw())

    with cf.ThreadPoolExecutor(8) as ex:
        jobs = [ex.submit(lambda: list(client.completions.create(stream=True, **args))) for _ in range(3)]
        jobs += [ex.submit(lambda: client.completions.create(**args)) for _ in range(3)] + [ex.submit(cut_off)]
        assert httpx.post(serve.url + "/v1/completions", content=b"{not json", timeout=10).status_code == 400
        r = httpx.post(serve.url + "/v1/completions", timeout=30, json={"model": "tiny", "prompt": "x",
                                                                        "max_tokens": 4, "temperature": -1})
        assert r.status_code == 400  # the replica's refusal, passed through
        for j in jobs:
            j.result()

    def settled() -> tuple[dict, dict[str, float], dict[str, float]] | None:
        """Idle, and one consistent view: no gauge moved while `argosy status` ran (the autoscaler ticks)."""
        before = samples(serve.url)
        st = status(serve.url)
        gw = samples(serve.url)
        rep = samples(st["models"][0]["replicas"][0]["url"])
        same = all(before.get(k) == v for k, v in gw.items() if k.startswith("argosy_fleet_") and "{" in k
                   and not k.split("{")[0].endswith(("_total", "_bucket", "_count", "_sum")))
        idle = st["models"][0]["in_flight"] == 0 and rep['vllm:num_requests_running{model_name="tiny"}'] == 0
        return (st, gw, rep) if idle and same else None

    deadline = time.monotonic() + 30  # the cut-off stream ends when the gateway and the replica see it gone
    while (got := settled()) is None:
        assert time.monotonic() < deadline, "the fleet did not go idle"
        time.sleep(0.2)
    st, gw, rep = got
    m = st["models"][0]
    assert gw['argosy_gateway_in_flight{model="tiny"}'] == m["in_flight"] == 0
    assert gw['argosy_gateway_queue_depth{model="tiny"}'] == m["queued"] == 0
    assert gw['argosy_fleet_held_requests{model="tiny"}'] == m["held"] == 0
    assert gw['argosy_fleet_desired_replicas{model="tiny"}'] == m["desired"]
    assert gw['argosy_fleet_panic_mode{model="tiny"}'] == (1 if m["panic"] else 0)
    assert gw['argosy_fleet_unplaceable{model="tiny"}'] == (1 if m["unplaceable"] else 0)
    assert gw['argosy_fleet_actual_replicas{model="tiny"}'] == len(ready(m)) == 1
    for state in ("starting", "warming", "ready", "draining"):
        for pooled in (False, True):
            n = sum(1 for r in m["replicas"] if r["state"] == state and r["pooled"] == pooled)
            key = f'argosy_fleet_replicas{{model="tiny",pooled="{str(pooled).lower()}",state="{state}"}}'
            assert gw[key] == n, key
    for r in m["replicas"]:
        assert gw[f'argosy_gateway_upstream_in_flight{{upstream="{r["url"]}"}}'] == r["in_flight"] == 0
        assert gw[f'argosy_gateway_upstream_healthy{{upstream="{r["url"]}"}}'] == 1
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert rep[f'{name}{{model_name="tiny"}}'] == 0, name


def status(url: str) -> dict:
    """`argosy status --json`, the command a person runs."""
    out = subprocess.run([sys.executable, "-m", "argosy.cli", "status", "--url", url, "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def samples(url: str) -> dict[str, float]:
    """A /metrics page as {'name{labels}': value}, labels sorted as prometheus_client writes them."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {s.name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items())) + "}": s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}
