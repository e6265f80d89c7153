"""Several models in one fleet file: each gets its own replicas and is served under its own name."""

from __future__ import annotations

import copy
import time

import httpx
import openai
import pytest

from tests.fleet_fixtures import Serve, ready, tiny_fleet

pytestmark = pytest.mark.timeout(240)


def test_two_models_scaled_independently(tiny_llama):
    fleet = tiny_fleet(tiny_llama, min_replicas=2, max_replicas=2)
    big = copy.deepcopy(fleet["models"][0])
    big["name"] = "big"
    big["autoscaling"].update(min_replicas=1, max_replicas=1)
    big["routing"] = {"policy": "least_load"}
    fleet["models"][0]["name"] = "embed"
    fleet["models"].append(big)
    serve = Serve(fleet)
    try:
        deadline = time.monotonic() + 120
        while True:
            models = {m["model"]: m for m in httpx.get(serve.url + "/admin/fleet", timeout=10).json()["models"]}
            counts = {name: len(ready(m)) for name, m in models.items()}
            if counts == {"embed": 2, "big": 1}:
                break
            assert time.monotonic() < deadline, f"replicas never reached 2 + 1: {counts}"
            time.sleep(0.3)
        urls = {name: {r["url"] for r in ready(m)} for name, m in models.items()}
        assert not urls["embed"] & urls["big"]  # separate replicas, not shared ones
        with openai.OpenAI(base_url=serve.url + "/v1", api_key="none", max_retries=0) as client:
            listed = {m.id for m in client.models.list().data}
            assert {"embed", "big"} <= listed
            for name in ("embed", "big"):
                r = client.completions.create(model=name, prompt="Hello", max_tokens=4,
                                              extra_body={"ignore_eos": True})
                assert r.model == name and r.usage.completion_tokens == 4
            with pytest.raises(openai.NotFoundError):
                client.completions.create(model="absent", prompt="Hello", max_tokens=4)
    finally:
        assert serve.stop() is not None


def test_first_request_to_an_unplaceable_model_at_zero_is_refused_at_once(tiny_llama):
    # A model at zero whose replica cannot be placed anywhere: its first request used to be held for the
    # whole cold_start_timeout_s (the placement was first tried after the request arrived), not 503 at once.
    fleet = tiny_fleet(tiny_llama, min_replicas=0, max_replicas=1, cold_start_timeout_s=60)
    fleet["nodes"] = [{"name": "small", "provider": "local", "memory_gib": 1}]
    fleet["models"][0]["engine"]["kv_cache_memory_gib"] = 8  # more than the node's RAM
    serve = Serve(fleet)
    try:
        for _ in range(2):  # the first (which triggers the placement) and the next
            t0 = time.monotonic()
            r = httpx.post(serve.url + "/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 2},
                           timeout=90)
            assert time.monotonic() - t0 < 10, "held for the cold start of a replica that cannot be placed"
            assert r.status_code == 503 and r.json()["error"]["code"] == "unplaceable", r.text
            assert r.headers["retry-after"] == "30"
    finally:
        assert serve.stop() is not None


def test_a_client_that_leaves_during_a_cold_start_is_not_held_for_it(tiny_llama, tmp_path):
    # The replica's interpreter starts 30 s late (a wrapper that sleeps): the first request is held for it.
    import sys

    slow = tmp_path / "slow-python"
    slow.write_text(f"#!/bin/sh\nsleep 30\nexec {sys.executable} \"$@\"\n")
    slow.chmod(0o755)
    fleet = tiny_fleet(tiny_llama, min_replicas=0, max_replicas=1, cold_start_timeout_s=60)
    fleet["providers"] = {"local": {"python": str(slow)}}
    serve = Serve(fleet)

    def held() -> int:
        return httpx.get(serve.url + "/admin/fleet", timeout=10).json()["models"][0]["held"]

    try:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up after 2 s and closes its connection
            httpx.post(serve.url + "/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 2},
                       timeout=2)
        deadline = time.monotonic() + 3
        while held():  # had stayed held until the replica was up, 30 s on
            assert time.monotonic() < deadline, "a request whose client left is still held for the cold start"
            time.sleep(0.2)
        assert serve.proc.poll() is None
    finally:
        assert serve.stop() is not None
