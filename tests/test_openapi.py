"""The OpenAPI documents (`/openapi.json`) of the replica and the gateway tell the truth: every documented
path answers (no 404 or 405 for a documented method), and every path the server serves is documented."""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import httpx
import pytest

from argosy.gateway.keys import new_key
from tests.fake_upstreams import FakeUpstream
from tests.gateway_fixtures import pepper_for_tests, start_gateway
from tests.server_fixtures import MODEL_NAME, ServerProcess

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[1]
BODIES = {
    "/v1/completions": {"model": "m", "prompt": "hello", "max_tokens": 2},
    "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/embeddings": {"model": "m", "input": "hi"},
    "/embed": {"model": "m", "inputs": "hi"},
    "/v1/rerank": {"model": "m", "query": "hi", "documents": ["a", "b"]},
    "/rerank": {"model": "m", "query": "hi", "texts": ["a", "b"]},
    "/tokenize": {"prompt": "hello"},
    "/detokenize": {"tokens": [1, 2]},
    "/admin/upstreams": {"model": "m", "url": "http://127.0.0.1:9"},
    "/admin/keys": {"name": "fuzz-doc"},
}


def call_each(url: str, doc: dict, model: str, headers=lambda path: {}) -> dict[str, int]:
    """Every documented (method, path), called with a plain valid request: path -> status."""
    seen = {}
    for path, ops in doc["paths"].items():
        concrete = path.replace("{model}", model).replace("{name}", "fuzz-doc").replace("{file}", "dashboard.js")
        concrete = concrete.replace("{action}", "pause")
        if path == "/admin/keys/{name}/rotate":
            concrete = "/admin/keys/u/rotate"  # the user key: it gets a new secret
        for method in ("get", "post", "delete", "head"):
            if method not in ops:
                continue
            body = {**BODIES.get(path, {})}
            if "model" in body:
                body["model"] = model
            r = httpx.request(method.upper(), url + concrete, json=body if method != "get" else None,
                              headers=headers(path), timeout=60)
            seen[f"{method.upper()} {path}"] = r.status_code
    return seen


def starlette_routes(app) -> set[str]:
    while not hasattr(app, "routes"):
        app = app.app
    return {re.sub(r"\{(\w+):\w+\}", r"{\1}", r.path) for r in app.routes}  # {model:path} -> {model}


def test_replica_document_is_complete_and_truthful(tiny_llama):
    from argosy.server.app import build_app

    key = secrets.token_urlsafe(16)
    with ServerProcess(tiny_llama, "--max-model-len", "128", env={"ARGOSY_API_KEY": key}) as server:
        auth = {"authorization": f"Bearer {key}"}
        assert httpx.get(server.url + "/openapi.json", timeout=10).status_code == 401
        from argosy import __version__  # vLLM's /version: open, as /health

        assert httpx.get(server.url + "/version", timeout=10).json() == {"version": __version__}
        doc = httpx.get(server.url + "/openapi.json", headers=auth, timeout=10).json()
        completion = doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]
        assert completion["schema"]["properties"]["max_tokens"]["anyOf"][0]["maximum"] == 128  # this replica's
        seen = call_each(server.url, doc, MODEL_NAME, lambda path: auth)
        assert all(s < 400 for s in seen.values()), seen
    served = starlette_routes(build_app("x", lambda: None, max_queue=1, max_body_bytes=1))
    assert served == set(doc["paths"]), served ^ set(doc["paths"])


def gateway_routes() -> set[tuple[str, str]]:
    """(METHOD, path) the gateway's route table serves; a prefix route as its document template."""
    from argosy.gateway.routes import PREFIX_ROUTES, ROUTES

    served = {(m, p.rstrip("/") or "/") for m, p in ROUTES}
    templates = {"/admin/keys/": {"DELETE": "/admin/keys/{name}", "POST": "/admin/keys/{name}/rotate"},
                 "/dashboard/": {"GET": "/dashboard/{file}"}, "/v1/models/": {"GET": "/v1/models/{model}"},
                 "/admin/rollouts/": {"GET": "/admin/rollouts/{model}", "POST": "/admin/rollouts/{model}/{action}"},
                 "/admin/shadow/": {"GET": "/admin/shadow/{model}"}}
    return served | {(m, templates[prefix][m]) for m, prefix, _ in PREFIX_ROUTES}


def test_gateway_document_is_complete_and_truthful():
    up = FakeUpstream("ok")
    user, user_hash = new_key(pepper_for_tests())
    admin, admin_hash = new_key(pepper_for_tests())
    gw = start_gateway({"keys": [{"name": "u", "hash": user_hash}], "admin_key_hash": admin_hash,
                        "models": [{"name": "m", "upstreams": [up.url]}]})
    try:
        doc = httpx.get(gw.url + "/openapi.json", timeout=10).json()
        from argosy import __version__

        assert httpx.get(gw.url + "/version", timeout=10).json() == {"version": __version__}  # no key needed
        seen = call_each(gw.url, doc, "m", lambda path: {
            "authorization": f"Bearer {admin if path.startswith('/admin/') else user}"})
        # the fleet's and rollouts' admin paths are served under `argosy serve` only; `m` is a chat model,
        # so the encoder endpoints answer TEI's 424
        serve_only = ("GET /admin/fleet", "GET /admin/rollouts", "GET /admin/rollouts/{model}",
                      "POST /admin/rollouts/{model}/{action}", "POST /admin/preempt",  # under `argosy serve`
                      "GET /admin/regions", "POST /regions/exchange")  # with regions configured
        encoder = ("POST /v1/embeddings", "POST /embed", "POST /v1/rerank", "POST /rerank")
        expected = {**dict.fromkeys(serve_only, 404), **dict.fromkeys(encoder, 424)}
        bad = {k: v for k, v in seen.items() if v >= 400 and expected.get(k) != v}
        assert not bad, bad
        documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
        assert gateway_routes() == documented, gateway_routes() ^ documented
    finally:
        gw.stop()
        up.stop()
