"""deploy/: Prometheus config and alert rules checked (and unit-tested) by promtool; the Grafana dashboard
and the alerts query only documented series; the dashboard page loads nothing from outside the package."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from tests.fleet_fixtures import ROOT
from tests.test_observe_fleet import documented

PROM = ROOT / "deploy" / "prometheus"
STATIC = ROOT / "argosy" / "observe" / "static"
SERIES = re.compile(r"\b(argosy_(?:gateway|fleet|gpu|host)_[a-z0-9_]+|vllm:[a-z0-9_]+|DCGM_FI_DEV_[A-Z0-9_]+)")


def series_in(expr: str) -> set[str]:
    """Series an expression names, histogram suffixes folded into the documented name."""
    names = set()
    for name in SERIES.findall(expr):
        names.add(re.sub(r"_(bucket|count|sum)$", "", name) if not name.endswith("_total") else name)
    return names


def promtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.skip("the promtool binary is absent (Debian: apt-get install prometheus; .ci/run installs it)")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60, cwd=PROM)


def test_promtool_accepts_the_config_and_the_rules():
    for args in (("check", "config", "prometheus.yml"), ("check", "rules", "alerts.yml")):
        out = promtool(*args)
        assert out.returncode == 0, out.stdout + out.stderr


def test_each_alert_fires_on_its_synthetic_history():
    out = promtool("test", "rules", "alerts_test.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    tested = {t["alertname"] for case in yaml.safe_load((PROM / "alerts_test.yml").read_text())["tests"]
              for t in case["alert_rule_test"]}
    assert {"ArgosyTTFTBudgetBurnFast", "ArgosyGatewayQueueGrowing", "ArgosyKVCacheNearFull",
            "ArgosyReplicaFlapping", "ArgosyErrorRate", "ArgosyGPUThrottled", "ArgosyGPUMemoryPressure",
            "ArgosyHostMemoryPressure", "ArgosyGPUXidError"} <= tested


def test_grafana_and_alerts_name_only_documented_series():
    docs = documented()
    dash = json.loads((ROOT / "deploy" / "grafana" / "argosy.json").read_text())
    assert {"datasource", "model"} <= {v["name"] for v in dash["templating"]["list"]}
    used: set[str] = set()
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", panel["title"]
            names = series_in(t["expr"])
            assert names, f"{panel['title']}: {t['expr']} names no series"
            assert names <= docs.keys(), f"{panel['title']}: undocumented {names - docs.keys()}"
            used |= names
    for part in ("argosy_gateway_", "argosy_fleet_", "vllm:", "DCGM_FI_DEV_", "argosy_gpu_", "argosy_host_"):
        assert any(n.startswith(part) for n in used), f"the dashboard shows no {part}* series"
    rules = [r for g in yaml.safe_load((PROM / "alerts.yml").read_text())["groups"] for r in g["rules"]]
    for r in rules:
        assert series_in(r["expr"]) <= docs.keys(), f"{r.get('alert') or r.get('record')}: undocumented series"


def test_the_dashboard_page_loads_nothing_from_outside_the_package():
    html = (STATIC / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs and all(r.startswith("/dashboard/") and (STATIC / r.removeprefix("/dashboard/")).is_file()
                        for r in refs), refs
    for f in ("dashboard.js", "dashboard.css", "uPlot.min.css"):
        assert "http://" not in (STATIC / f).read_text() and "https://" not in (STATIC / f).read_text(), f
    code = (STATIC / "uPlot.iife.min.js").read_text()
    assert "import(" not in code and "fetch(" not in code and (STATIC / "uPlot.LICENSE").is_file()
