"""`argosy keys` against running gateways: a key works at once, a revoked or rotated one is refused at once on
two gateways sharing a real Redis, and `list` shows each key's usage and spend."""

from __future__ import annotations

import argparse
import os
import stat

import httpx
import pytest

from argosy.gateway.keys import new_key
from argosy.gateway.keys_cli import add_keys_arguments, run_keys
from tests.gateway_fixtures import start_gateway, start_redis, start_upstream


def keys(capsys, monkeypatch, admin_file, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setenv("ARGOSY_ADMIN_FILE", admin_file)
    monkeypatch.delenv("ARGOSY_ADMIN_KEY", raising=False)
    parser = argparse.ArgumentParser()
    add_keys_arguments(parser)
    code = run_keys(parser.parse_args(argv))
    out = capsys.readouterr()
    return code, out.out.strip(), out.err


def post(url: str, key: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two gateways on one Redis, each with its own local admin credential; the fleet file has one key."""
    folder = tmp_path_factory.mktemp("keys")
    redis, redis_url = start_redis()
    up = start_upstream("u")
    ops_key, ops_hash = new_key()
    cfg = {"gateway": {"redis_url": redis_url}, "keys": [{"name": "ops", "hash": ops_hash}],
           "models": [{"name": "m", "upstreams": [up.url]}]}
    files = [str(folder / f"admin-{i}.json") for i in (0, 1)]
    gateways = []
    try:
        for f in files:
            gateways.append(start_gateway(cfg, env={"ARGOSY_ADMIN_FILE": f}))
        yield gateways, files, ops_key
    finally:
        for g in gateways:
            g.stop()
        up.stop()
        redis.kill()
        redis.wait()


def test_add_works_at_once_on_both_gateways_and_list_shows_usage(fleet, capsys, monkeypatch):
    (a, b), (file_a, _), _ = fleet
    assert stat.S_IMODE(os.stat(file_a).st_mode) == 0o600  # the local admin credential: its owner's only
    code, key, err = keys(capsys, monkeypatch, file_a, "add", "team", "--budget", "5", "--expires", "30d")
    assert code == 0 and key.startswith("sk-argosy-") and "every gateway" in err
    assert post(a.url, key).status_code == 200 and post(b.url, key).status_code == 200
    assert post(b.url, key).status_code == 200
    code, table, _ = keys(capsys, monkeypatch, file_a, "list")
    row = next(line.split() for line in table.splitlines() if line.startswith("team "))
    requests, tokens_in, tokens_out, spend = row[-4:]
    assert (requests, int(tokens_in) > 0, int(tokens_out) > 0, float(spend) > 0) == ("3", True, True, True)
    assert any(line.startswith("ops ") for line in table.splitlines())  # the fleet file's key too
    dashboard = httpx.get(b.url + "/dashboard/data", timeout=30).json()  # usage is shared through Redis
    team = next(k for k in dashboard["keys"] if k["name"] == "team")
    assert team["requests"] == 3 and team["output_tokens"] > 0 and team["spend_usd"] > 0 and team["budget_usd"] == 5


def test_revoke_and_rotate_take_effect_at_once_on_the_other_gateway(fleet, capsys, monkeypatch):
    (a, b), (file_a, file_b), ops_key = fleet
    _, key, _ = keys(capsys, monkeypatch, file_a, "add", "short-lived")
    assert post(b.url, key).status_code == 200
    assert keys(capsys, monkeypatch, file_a, "revoke", "short-lived")[0] == 0
    assert post(b.url, key).status_code == 401 and post(a.url, key).status_code == 401
    # A fleet-file key rotated through the other gateway: the old secret stops everywhere, the new one works.
    code, new, _ = keys(capsys, monkeypatch, file_b, "rotate", "ops")
    assert code == 0 and new != ops_key
    assert post(a.url, ops_key).status_code == 401 and post(a.url, new).status_code == 200
    assert post(b.url, new).status_code == 200


def test_expiry_budget_and_an_admin_api_closed_to_others(fleet, capsys, monkeypatch):
    (a, b), (file_a, _), _ = fleet
    _, expired, err = keys(capsys, monkeypatch, file_a, "add", "expired", "--expires", "0m")
    assert "is not in the future" in err  # made, as asked, but said
    r = post(b.url, expired)
    assert r.status_code == 401 and r.json()["error"]["code"] == "key_expired"
    _, tiny, _ = keys(capsys, monkeypatch, file_a, "add", "tiny", "--budget", "0.0000001")
    assert post(a.url, tiny).status_code == 200  # nothing spent yet
    r = post(b.url, tiny)
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"
    assert "of $0.0000001)" in r.json()["error"]["message"]  # had been "of $1e-07"
    # Keys exist and no admin key is set: without the local credential the admin API says what to do.
    r = httpx.get(a.url + "/admin/keys", timeout=10)
    assert r.status_code == 403 and "local admin credential" in r.json()["error"]["message"]


def test_offline_and_unreachable_say_what_to_do(tmp_path, capsys, monkeypatch):
    missing = str(tmp_path / "none.json")
    code, _, err = keys(capsys, monkeypatch, missing, "list")
    assert code == 2 and "argosy serve" in err and "--offline" in err and "Traceback" not in err
    fleet_file = tmp_path / "fleet.yaml"
    code, key, err = keys(capsys, monkeypatch, missing, "add", "x", "--config", str(fleet_file), "--offline")
    assert code == 0 and key.startswith("sk-argosy-") and "restart the gateway" in err
    fleet_file.write_text("gateway:\n  port: 8000\n  host: a: b\n")  # a colon too many, line 3
    code, _, err = keys(capsys, monkeypatch, missing, "list", "--config", str(fleet_file), "--offline")
    assert code == 2 and f"{fleet_file}:3:" in err and "YAML syntax error" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("name", ["", "two words", "line\nbreak", "a/b", "x" * 65])
def test_a_key_name_that_logs_labels_or_urls_would_mangle_is_refused(fleet, tmp_path, capsys, monkeypatch, name):
    (a, _), (file_a, _), _ = fleet
    rule = "a key name is 1 to 64 characters, without spaces, slashes or control characters"
    code, key, err = keys(capsys, monkeypatch, file_a, "add", name)  # online: the admin API's check
    assert code == 2 and not key and (rule in err or (not name and "give the new key a 'name'" in err))
    fleet_file = tmp_path / "fleet.yaml"  # offline: the fleet file's, the same rule
    code, key, err = keys(capsys, monkeypatch, file_a, "add", name, "--config", str(fleet_file), "--offline")
    assert code == 2 and not key and rule in err and not fleet_file.exists()
    code, listed, _ = keys(capsys, monkeypatch, file_a, "list")
    assert code == 0 and "two words" not in listed and "line" not in listed


def test_two_gateways_on_one_machine_each_keep_their_local_admin_credential(tmp_path, capsys, monkeypatch):
    """A second gateway's start had replaced the first one's local admin credential: its owner's `argosy keys
    list --url FIRST` was then refused (403) until the first was restarted. Each now has its entry; a
    gateway that stops takes its entry out, and one that was killed is skipped."""
    from argosy.gateway import local_admin

    admin_file = str(tmp_path / "admin.json")
    up = start_upstream("u")
    _, ops_hash = new_key()
    cfg = {"keys": [{"name": "ops", "hash": ops_hash}], "models": [{"name": "m", "upstreams": [up.url]}]}
    gateways = []
    try:
        for _ in range(2):
            gateways.append(start_gateway(cfg, env={"ARGOSY_ADMIN_FILE": admin_file}))
        a, b = gateways
        for g in (a, b):
            code, table, err = keys(capsys, monkeypatch, admin_file, "list", "--url", g.url)
            assert code == 0 and any(line.startswith("ops ") for line in table.splitlines()), err
        assert local_admin.read()["url"] == b.url  # `argosy keys` with no --url: the newest gateway
        assert local_admin.default_url() == b.url  # and `argosy status` / `argosy rollout` (they had tried :8000)
        b.stop()
        assert local_admin.read()["url"] == a.url and local_admin.key_for(b.url) is None
        a.kill()  # no chance to take its entry out: skipped, as its process is gone
        assert local_admin.read() is None and local_admin.key_for(a.url) is None
        assert local_admin.default_url() == "http://127.0.0.1:8000"  # none running: the default port
    finally:
        for g in gateways:
            g.stop()
        up.stop()


def test_a_credential_file_written_before_it_held_several_gateways_is_still_read(tmp_path, monkeypatch):
    import json

    from argosy.gateway import local_admin

    monkeypatch.setenv("ARGOSY_ADMIN_FILE", str(tmp_path / "admin.json"))
    (tmp_path / "admin.json").write_text(json.dumps({"url": "http://0.0.0.0:8000", "key": "sk-argosy-local-old"}))
    assert local_admin.read()["key"] == "sk-argosy-local-old"
    assert local_admin.key_for("http://127.0.0.1:8000") == "sk-argosy-local-old"
    local_admin.issue("http://127.0.0.1:9000")  # a new gateway keeps the old entry beside its own
    assert local_admin.key_for("http://127.0.0.1:8000") == "sk-argosy-local-old"
    assert local_admin.read()["url"] == "http://127.0.0.1:9000"
    assert oct((tmp_path / "admin.json").stat().st_mode & 0o777) == "0o600"


def test_revoking_the_last_key_locks_the_gateway_rather_than_opening_it(tmp_path, capsys, monkeypatch):
    """The gateway's only key revoked: it had then served anyone without a key, beyond loopback too (where a
    gateway with no keys refuses to start). Now every request is a 401 until a key is added; and the CLI says
    that a fleet-file key revoked without Redis comes back at the next start unless the file loses it too."""
    admin_file = str(tmp_path / "admin.json")
    up = start_upstream("u")
    ops_key, ops_hash = new_key()
    gw = start_gateway({"keys": [{"name": "ops", "hash": ops_hash}], "models": [{"name": "m", "upstreams": [up.url]}]},
                       env={"ARGOSY_ADMIN_FILE": admin_file})
    try:
        assert post(gw.url, ops_key).status_code == 200
        code, _, err = keys(capsys, monkeypatch, admin_file, "revoke", "ops", "--url", gw.url)
        assert code == 0 and "comes back when the gateway restarts" in err and "no keys left" in err, err
        keyless = httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2},
                             timeout=30)
        for r in (post(gw.url, ops_key), keyless):
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
        r = httpx.get(gw.url + "/admin/keys", timeout=10)  # nor do the admin routes open without a key
        assert r.status_code in (401, 403), r.text
        code, new, _ = keys(capsys, monkeypatch, admin_file, "add", "fresh", "--url", gw.url)
        assert code == 0 and post(gw.url, new).status_code == 200
    finally:
        gw.stop()
        up.stop()
