"""Helpers for the rollout tests: revision checkpoints, a fleet with revisions, and a steady load from the
official `openai` client that counts every request (answered, failed, cut off) and which revision answered."""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

from tests.fleet_fixtures import Serve, tiny_fleet


def rollout_fleet(checkpoint: str, revisions: list[dict], rollout: dict, state_file: str, **autoscaling) -> dict:
    """tiny_fleet with `revisions`, a `rollout` section and its state file."""
    fleet = tiny_fleet(checkpoint, **{"min_replicas": 1, "max_replicas": 1, **autoscaling})
    fleet["state_file"] = state_file
    fleet["models"][0].update(revisions=revisions, rollout=rollout)
    return fleet


def broken_checkpoint(good: str, folder: Path) -> str:
    """A checkpoint whose config.json reads but whose weights cannot load (the safetensors file cut short)."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in Path(good).iterdir():
        if f.is_file():
            shutil.copy(f, folder / f.name)
    w = folder / "model.safetensors"
    w.write_bytes(w.read_bytes()[:200])
    return str(folder)


@dataclass
class Load:
    """`workers` threads each sending one streamed completion after another through the openai client."""
    url: str
    model: str
    workers: int = 2
    max_tokens: int = 16
    temperature: float = 0.0
    sessions: bool = False  # each worker sends its own x-session-id
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    by_revision: Counter = field(default_factory=Counter)
    first_revision: dict[int, str] = field(default_factory=dict)
    moved_sessions: int = 0  # a worker's session answered by another revision than its first, while both ran
    ttfts: list[tuple[float, float, str]] = field(default_factory=list)  # (when it ended, wall clock; TTFT s; revision)

    def __post_init__(self):
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.workers)]

    def start(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def _run(self, i: int) -> None:
        client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=120)
        headers = {"x-session-id": f"worker-{i}"} if self.sessions else {}
        n = 0
        while not self.stopping.is_set():
            n += 1
            t0 = time.monotonic()
            try:
                raw = client.completions.with_raw_response.create(
                    model=self.model, prompt=f"Request {n} from worker {i}: tell me", max_tokens=self.max_tokens,
                    temperature=self.temperature, stream=True, extra_headers=headers, extra_body={"ignore_eos": True})
                rev = raw.headers.get("x-argosy-revision", "?")
                ttft, finish = None, None
                for chunk in raw.parse():
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    for c in chunk.choices:
                        finish = c.finish_reason or finish
                with self.lock:
                    if finish is None:
                        self.failed.append(f"worker {i} request {n}: stream ended without a finish_reason")
                        continue
                    self.ok += 1
                    self.by_revision[rev] += 1
                    self.ttfts.append((time.time(), ttft or 0.0, rev))
                    self.first_revision.setdefault(i, rev)
            except Exception as e:  # every failure counts: an error status, a refused or cut connection
                with self.lock:
                    self.failed.append(f"worker {i} request {n}: {type(e).__name__}: {str(e)[:200]}")

    def stop(self) -> Load:
        self.stopping.set()
        for t in self.threads:
            t.join(180)
        return self

    def summary(self) -> str:
        return f"{self.ok} answered, {len(self.failed)} failed, by revision {dict(self.by_revision)}"


def admin(serve: Serve, method: str, path: str, body: dict | None = None) -> dict:
    r = httpx.request(method, serve.url + path, json=body, timeout=60)
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


def rollout_of(serve: Serve, model: str = "tiny") -> dict:
    return admin(serve, "GET", f"/admin/rollouts/{model}")


def wait_rollout(serve: Serve, what: str, cond, timeout: float = 120.0, model: str = "tiny") -> dict:
    """Poll the rollout status until cond(status) holds; prints the phase each second."""
    t0 = last = time.monotonic()
    while True:
        st = rollout_of(serve, model)
        if cond(st):
            return st
        now = time.monotonic()
        if now - t0 > timeout:
            tail = "\n".join(serve.lines[-30:])
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}: {st}\n{tail}")
        if now - last >= 1:
            r = st["rollout"] or {}
            print(f"  [{now - t0:5.1f} s] waiting for {what}: {r.get('phase')} weight {r.get('weight')} "
                  f"split {st['split']} analyses {r.get('analyses')}", flush=True)
            last = now
        time.sleep(0.2)


def events(serve: Serve, kind: str) -> list[str]:
    """Log lines of one JSON event kind (e.g. "rollout_aborted")."""
    return [ln for ln in serve.lines if f'"event": "{kind}"' in ln]


def random_twin(checkpoint: str | Path, folder: Path, seed: int = 0) -> str:
    """The checkpoint's config and tokenizer with random weights of the same shapes (each tensor drawn with
    its original's mean and standard deviation)."""
    import torch
    from safetensors.torch import load_file, save_file

    folder.mkdir(parents=True, exist_ok=True)
    for f in Path(checkpoint).iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    gen = torch.Generator().manual_seed(seed)
    weights = load_file(str(Path(checkpoint) / "model.safetensors"))
    twin = {}
    for name, t in weights.items():
        x = t.float()
        std = x.std().item() if x.numel() > 1 else 0.0
        twin[name] = (torch.randn(t.shape, generator=gen) * std + x.mean()).to(t.dtype).contiguous()
    save_file(twin, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return str(folder)
