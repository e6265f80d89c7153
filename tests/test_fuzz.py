"""A bounded fuzz run (schemathesis, positive and negative cases from each /openapi.json) against a real
gateway in front of a real replica, and against the replica directly: no response >= 500, nothing
crashed, and ordinary requests are all answered afterwards. The long run, with the hand-written nasty
cases and LiteLLM's proxy beside it: `python bench/reliability/fuzz.py` (RELIABILITY.md)."""

from __future__ import annotations

import secrets

import httpx
import pytest

from argosy.gateway.keys import new_key
from tests.fuzz_runner import run_schemathesis
from tests.gateway_fixtures import pepper_for_tests, start_gateway
from tests.server_fixtures import MODEL_NAME, ServerProcess

pytestmark = pytest.mark.timeout(300)


def test_fuzzed_gateway_and_replica_never_answer_5xx(tiny_llama, tmp_path):
    secret = secrets.token_urlsafe(32)
    user, user_hash = new_key(pepper_for_tests())
    admin, admin_hash = new_key(pepper_for_tests())
    replica = ServerProcess(tiny_llama, "--max-model-len", "64", env={"ARGOSY_API_KEY": secret})
    gw = start_gateway({"keys": [{"name": "fuzz-user-key", "hash": user_hash}], "admin_key_hash": admin_hash,
                        "models": [{"name": MODEL_NAME, "upstreams": [replica.url]}]},
                       env={"ARGOSY_UPSTREAM_API_KEY": secret})
    try:
        runs = [
            run_schemathesis(gw.url + "/openapi.json", gw.url, tmp_path / "gw.har", max_examples=8,
                             headers={"Authorization": f"Bearer {user}"}, exclude_path_regex="^/admin/",
                             target="gateway"),
            run_schemathesis(gw.url + "/openapi.json", gw.url, tmp_path / "admin.har", max_examples=4,
                             headers={"Authorization": f"Bearer {admin}"}, include_path_regex="^/admin/(keys|fleet)",
                             target="gateway admin"),
            run_schemathesis(replica.url + "/openapi.json", replica.url, tmp_path / "replica.har", max_examples=6,
                             headers={"Authorization": f"Bearer {secret}"}, target="replica"),
        ]
        for run in runs:
            print(f"{run.target}: {run.cases} cases, statuses {dict(sorted(run.by_status.items()))}")
        assert all(run.cases > 80 for run in runs)
        errors = [e for run in runs for e in run.server_errors]
        assert not errors, "\n".join(errors[:20])
        assert gw.popen.poll() is None and replica.proc.poll() is None
        auth = {"authorization": f"Bearer {user}"}
        for i in range(20):
            body = {"model": MODEL_NAME, "prompt": f"ordinary request {i}", "max_tokens": 4, "stream": i % 2 == 1}
            r = httpx.post(gw.url + "/v1/completions", json=body, headers=auth, timeout=60)
            assert r.status_code == 200, r.text
    finally:
        gw.stop()
        replica.stop()
