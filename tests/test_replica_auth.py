"""Replicas are no side door (issue 15 item 3): `argosy engine --api-key` / ARGOSY_API_KEY, and the
secret `argosy serve` gives its replicas through the environment and shows them on every call."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from argosy.server.auth import RequireAPIKey
from tests.fleet_fixtures import Serve, engine_pids, ready, tiny_fleet

pytestmark = pytest.mark.timeout(240)


def test_require_api_key_leaves_health_ready_and_metrics_open():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guarded = RequireAPIKey(app, "s3cret")

    async def call(path: str, auth: bytes | None) -> tuple[int, bytes]:
        out = []

        async def send(m):
            out.append(m)
        headers = [(b"authorization", auth)] if auth is not None else []
        await guarded({"type": "http", "path": path, "headers": headers}, None, send)
        return out[0]["status"], out[-1]["body"]

    async def main():
        for path in ("/health", "/ready", "/metrics"):
            assert (await call(path, None))[0] == 200
        for auth in (None, b"Bearer wrong", b"s3cret", b"Bearer s3cret "):
            status, body = await call("/v1/completions", auth)
            assert status == 401 and b'"type":"authentication_error"' in body and b'"code":"invalid_api_key"' in body
        assert (await call("/v1/models", b"Bearer s3cret"))[0] == 200
    asyncio.run(main())


def test_replicas_of_argosy_serve_refuse_direct_calls_and_serve_through_the_gateway(tiny_llama):
    serve = Serve(tiny_fleet(tiny_llama, min_replicas=1, max_replicas=1))
    try:
        st = serve.wait_for("a ready replica", lambda st: len(ready(st)) == 1)
        replica = ready(st)[0]["url"]
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 4}
        direct = httpx.post(replica + "/v1/completions", json=body, timeout=30)
        assert direct.status_code == 401 and direct.json()["error"]["type"] == "authentication_error"
        assert httpx.get(replica + "/v1/models", timeout=10).status_code == 401
        assert httpx.post(replica + "/v1/completions", json=body, timeout=30,
                          headers={"authorization": "Bearer guess"}).status_code == 401
        for open_path in ("/health", "/ready", "/metrics"):
            assert httpx.get(replica + open_path, timeout=10).status_code == 200
        via = httpx.post(serve.url + "/v1/completions", json=body, timeout=60)
        assert via.status_code == 200 and via.json()["choices"][0]["text"] is not None
        stream = httpx.post(serve.url + "/v1/completions", json={**body, "stream": True}, timeout=60)
        assert stream.status_code == 200 and stream.text.rstrip().endswith("data: [DONE]")
        (pid,) = engine_pids(tiny_llama)
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        secret = next(v.split(b"=", 1)[1] for v in environ if v.startswith(b"ARGOSY_API_KEY="))
        assert len(secret) >= 32 and secret not in Path(f"/proc/{pid}/cmdline").read_bytes()  # not in `ps`
        assert httpx.get(replica + "/v1/models", headers={"authorization": b"Bearer " + secret},
                         timeout=10).status_code == 200
        assert secret.decode() not in "\n".join(serve.lines)  # never printed or logged
    finally:
        serve.stop()
