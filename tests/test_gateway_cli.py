"""The fleet file model, `argosy keys add`, safe defaults and TLS, with real gateway processes."""

import argparse
import ssl
import subprocess
import sys

import httpx
import openai
import pytest
import yaml

from argosy.config import FleetConfigError, load_fleet
from argosy.gateway.keys_cli import add_keys_arguments, run_keys
from tests.gateway_fixtures import ROOT, start_gateway, start_upstream

EXAMPLE = ROOT / "examples" / "fleet.example.yaml"


def test_example_fleet_file_validates():
    f = load_fleet(EXAMPLE)
    chat = f.models[0]
    assert chat.routing.policy == "prefix" and chat.routing.balance_abs == 32
    assert chat.guardrails.input[0].pii == "redact" and chat.traffic[1].weight == 10
    assert f.models[1].upstreams == ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]


def test_empty_file_is_all_defaults_and_typos_name_the_field(tmp_path):
    p = tmp_path / "fleet.yaml"
    p.write_text("")
    f = load_fleet(p)
    assert f.gateway.host == "127.0.0.1" and f.gateway.port == 8000 and f.models == [] and f.keys == []
    p.write_text("models:\n  - name: m\n    routing: {polcy: prefix}\n")
    with pytest.raises(FleetConfigError, match=r"models\.0\.routing\.polcy"):
        load_fleet(p)
    p.write_text("models:\n  - name: m\n    guardrails: {input: [{pii: redact, blocklist: [x]}]}\n")
    with pytest.raises(FleetConfigError, match="exactly one"):
        load_fleet(p)
    p.write_text("models:\n  - name: m\n    upstreams: [10.0.0.1:8000]\n")
    with pytest.raises(FleetConfigError, match="not an http"):
        load_fleet(p)


def test_refuses_a_public_address_without_keys(tmp_path):
    p = tmp_path / "fleet.yaml"
    p.write_text("gateway: {host: 0.0.0.0, port: 0}\n")
    r = subprocess.run([sys.executable, "-m", "argosy.gateway", "--config", str(p)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "argosy keys add" in r.stderr and "--insecure" in r.stderr


def test_no_keys_on_loopback_needs_no_key(tmp_path):
    up = start_upstream("u")
    gw = None
    try:
        gw = start_gateway({"models": [{"name": "m", "upstreams": [up.url]}]})
        assert gw.url.startswith("http://127.0.0.1:")
        r = httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "hi"})
        assert r.status_code == 200
    finally:
        if gw:
            gw.stop()
        up.stop()


def test_keys_add_then_tls_gateway_accepts_it(tmp_path, capsys):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    fleet = tmp_path / "fleet.yaml"
    ap = argparse.ArgumentParser()
    add_keys_arguments(ap)
    assert run_keys(ap.parse_args(["add", "team-a", "--config", str(fleet), "--models", "m", "--rpm", "100",
                                   "--offline"])) == 0
    captured = capsys.readouterr()
    api_key = captured.out.strip()
    stored = yaml.safe_load(fleet.read_text())
    assert stored["keys"][0]["name"] == "team-a" and api_key not in fleet.read_text()
    assert "restart the gateway" in captured.err
    assert run_keys(ap.parse_args(["add", "team-a", "--config", str(fleet), "--offline"])) == 2  # duplicate name
    up = start_upstream("u")
    gw = None
    try:
        cfg = {**stored, "gateway": {"tls": {"cert": str(cert), "key": str(key)}},
               "models": [{"name": "m", "upstreams": [up.url]}]}
        gw = start_gateway(cfg)
        assert gw.url.startswith("https://")
        ctx = ssl.create_default_context(cafile=str(cert))
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key=api_key, max_retries=0,
                          http_client=httpx.Client(verify=ctx))
        assert c.completions.create(model="m", prompt="x", max_tokens=2).system_fingerprint == "u"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-wrong", max_retries=0,
                          http_client=httpx.Client(verify=ctx)).models.list()
    finally:
        if gw:
            gw.stop()
        up.stop()
