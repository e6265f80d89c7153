"""Fuzzing the front door (issue 15): schemathesis cases from each /openapi.json (at least `--examples`
per operation, positive and negative) and the hand-written nasty cases (tests/nasty_cases.py), against
a real gateway in front of a real replica and against the replica directly; then 20 ordinary requests.
With LiteLLM's proxy (its own venv, see /work/shared/PEERS.md) in front of the same replica, the same
generated cases for the two completion endpoints go to it and to the gateway, counts side by side.

  python bench/reliability/fuzz.py [--examples 1000] [--litellm-venv /work/peers/litellm]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ARGOSY_KEY_PEPPER", "argosy-bench-pepper-" + secrets.token_hex(8))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from argosy.gateway.keys import new_key  # noqa: E402
from tests.fuzz_runner import run_schemathesis  # noqa: E402
from tests.gateway_fixtures import start_gateway  # noqa: E402
from tests.nasty_cases import run_cases  # noqa: E402
from tests.server_fixtures import MODEL_NAME, ServerProcess, free_port  # noqa: E402

PEER_ENV = dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", LITELLM_LOCAL_MODEL_COST_MAP="True", DO_NOT_TRACK="1")
GENERATE = "^/v1/(chat/)?completions$"


def start_litellm(venv: Path, replica_url: str, secret: str, tmp: Path) -> tuple[subprocess.Popen, str, str]:
    master = "sk-litellm-" + secrets.token_hex(8)
    cfg = tmp / "litellm.yaml"
    cfg.write_text(json.dumps({"model_list": [{"model_name": MODEL_NAME, "litellm_params": {
        "model": f"text-completion-openai/{MODEL_NAME}", "api_base": replica_url + "/v1", "api_key": secret}}],
        "general_settings": {"master_key": master}}))
    port = free_port()
    log = open(tmp / "litellm.log", "w")
    proc = subprocess.Popen([str(venv / "bin/litellm"), "--config", str(cfg), "--host", "127.0.0.1", "--port",
                             str(port), "--num_workers", "1"], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **PEER_ENV})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600  # minutes on a busy 2-core machine
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health/liveliness", timeout=2).status_code == 200:
                return proc, url, master
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(1)
    proc.kill()
    raise RuntimeError(f"LiteLLM did not start; see {tmp / 'litellm.log'}")


def ordinary(url: str, key: str, n: int = 20) -> int:
    ok = 0
    for i in range(n):
        body = {"model": MODEL_NAME, "prompt": f"ordinary request {i}", "max_tokens": 4, "stream": i % 2 == 1}
        r = httpx.post(url + "/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=120)
        ok += r.status_code == 200
    return ok


def show(run) -> str:
    return (f"{run.target}: {run.cases} cases, {run.errors_5xx} >= 500; statuses "
            f"{dict(sorted(run.by_status.items()))}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=1000, help="schemathesis cases per operation (fuzzing phase)")
    ap.add_argument("--litellm-venv", default="/work/peers/litellm", help="a venv with litellm[proxy]")
    ap.add_argument("--compare-only", action="store_true",
                    help="only the completion endpoints, on the gateway and on LiteLLM (the side-by-side counts)")
    args = ap.parse_args()
    from argosy.engine.random_model import make_random_model

    tmp = Path(tempfile.mkdtemp(prefix="argosy-fuzz-"))
    ckpt = str(make_random_model(tmp / "ckpt", arch="llama", init_std=0.2))
    secret = secrets.token_urlsafe(32)
    pepper = os.environ["ARGOSY_KEY_PEPPER"].encode()
    user, user_hash = new_key(pepper)
    admin, admin_hash = new_key(pepper)
    replica = ServerProcess(ckpt, "--max-model-len", "64", env={"ARGOSY_API_KEY": secret})
    gw = start_gateway({"keys": [{"name": "fuzz-user-key", "hash": user_hash}], "admin_key_hash": admin_hash,
                        "models": [{"name": MODEL_NAME, "upstreams": [replica.url]}]},
                       env={"ARGOSY_UPSTREAM_API_KEY": secret})
    litellm = None
    failures = 0
    try:
        schema = tmp / "gateway-openapi.json"
        schema.write_text(httpx.get(gw.url + "/openapi.json", timeout=10).text)
        n = args.examples
        gw_doc = json.loads(schema.read_text())
        rep_doc = httpx.get(replica.url + "/openapi.json", headers={"authorization": f"Bearer {secret}"}).json()
        gw_user = dict(headers={"Authorization": f"Bearer {user}"}, max_examples=n, templates=list(gw_doc["paths"]))
        runs = [] if args.compare_only else [
            run_schemathesis(str(schema), gw.url, tmp / "gw.har", exclude_path_regex=f"^/admin/|{GENERATE}",
                             target="gateway (other endpoints)", **gw_user),
        ]
        generate = run_schemathesis(str(schema), gw.url, tmp / "gw-generate.har", include_path_regex=GENERATE,
                                    target="gateway: completions + chat", **gw_user)
        runs.append(generate)
        runs += [] if args.compare_only else [
            run_schemathesis(str(schema), gw.url, tmp / "admin.har", max_examples=n,
                             headers={"Authorization": f"Bearer {admin}"},
                             include_path_regex="^/admin/(keys|fleet)", target="gateway admin",
                             templates=list(gw_doc["paths"])),
            run_schemathesis(replica.url + "/openapi.json", replica.url, tmp / "replica.har", max_examples=n,
                             headers={"Authorization": f"Bearer {secret}"}, target="replica",
                             templates=list(rep_doc["paths"])),
        ]
        documented = {f"{m.upper()} {p}" for d in (gw_doc, rep_doc) for p, ops in d["paths"].items() for m in ops}
        for run in runs:
            print(show(run), flush=True)
            print("  by documented operation:", {k: v for k, v in sorted(run.by_operation.items()) if k in documented},
                  flush=True)
            for e in run.server_errors[:10]:
                print("   ", e[:300])
            failures += run.errors_5xx
        for target, url, auth in () if args.compare_only else (("replica", replica.url, secret),
                                                                ("gateway", gw.url, user)):
            seen, bad = run_cases(url, MODEL_NAME, auth)
            print(f"nasty cases, {target}: {sum(seen.values())} cases, {len(bad)} failed; answers {dict(seen)}")
            for b in bad[:20]:
                print("   ", b)
            failures += len(bad)
        alive = gw.popen.poll() is None and replica.proc.poll() is None
        ok = ordinary(gw.url, user)
        print(f"after: gateway and replica running: {alive}; ordinary requests answered: {ok}/20", flush=True)
        failures += (not alive) + (20 - ok)

        venv = Path(args.litellm_venv)
        if (venv / "bin/litellm").exists():
            litellm, ll_url, master = start_litellm(venv, replica.url, secret, tmp)
            ll = run_schemathesis(str(schema), ll_url, tmp / "litellm.har", include_path_regex=GENERATE,
                                  headers={"Authorization": f"Bearer {master}"}, max_examples=n,
                                  target="LiteLLM proxy: completions + chat", templates=list(gw_doc["paths"]))
            print(show(ll))
            print("  by documented operation:", {k: v for k, v in sorted(ll.by_operation.items()) if k in documented})
            for e in ll.server_errors[:10]:
                print("   ", e[:300])
            seen, bad = run_cases(ll_url, MODEL_NAME, master)
            print(f"nasty cases, LiteLLM: {sum(seen.values())} cases, {len(bad)} failed; answers {dict(seen)}")
            print("\n| target (same generated cases, seed 1) | cases | responses >= 500 |\n|---|---|---|")
            print(f"| Argosy gateway | {generate.cases} | {generate.errors_5xx} |")
            print(f"| LiteLLM proxy | {ll.cases} | {ll.errors_5xx} |")
        else:
            print(f"LiteLLM: no venv at {venv} (pip install 'litellm[proxy]' there); comparison skipped")
    finally:
        if litellm is not None:
            litellm.terminate()
            litellm.wait(30)
        gw.stop()
        replica.stop()
    print(f"\nfuzz, {time.strftime('%Y-%m-%d')}: {failures} failures (responses >= 500, hangs, crashes, "
          f"ordinary requests not answered)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
