"""Fault-matrix scenarios with real replicas: `argosy engine` subprocesses (tiny random-weight
checkpoints) behind a real gateway, each shown the replica secret as `argosy serve` would. A replica is
SIGKILLed mid-stream, mid-queue or mid-prefill, or SIGSTOPped and later resumed; a replica whose KV
cache cannot hold the prompts. Each returns the counting client's Tally (tests/load_counter.py).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import time

import httpx

from tests.fault_scenarios import GATEWAY, run_load
from tests.gateway_fixtures import start_gateway
from tests.load_counter import CountingClient, Tally
from tests.server_fixtures import MODEL_NAME, ServerProcess, parse_metrics

# Tiny model: a long stream is ~1-2 s here; the timeouts are well above a healthy replica's answer.
REPLICA_GATEWAY = {**GATEWAY, "first_byte_timeout_s": 8.0, "idle_read_timeout_s": 4.0}
LONG_PROMPT = " ".join(f"w{i % 50}" for i in range(600))


class ReplicaPair:
    """Two engine replicas (the secret in their environment) behind one gateway that shows it."""

    def __init__(self, ckpt: str, *flags: str):
        self.secret = secrets.token_urlsafe(32)
        env = {"ARGOSY_API_KEY": self.secret}
        self.replicas = [ServerProcess(ckpt, "--kv-cache-memory", "0.05", *flags, env=env, wait=False)
                         for _ in range(2)]
        for r in self.replicas:
            r.wait_ready()
        self.gateway = start_gateway(
            {"gateway": REPLICA_GATEWAY, "models": [{"name": MODEL_NAME, "upstreams": [r.url for r in self.replicas],
                                                     "routing": {"policy": "least_load"}}]},
            env={"ARGOSY_UPSTREAM_API_KEY": self.secret})

    def waiting(self, i: int) -> float:
        m = parse_metrics(httpx.get(self.replicas[i].url + "/metrics", timeout=5).text)
        return sum(v for k, v in m.items() if k.startswith("vllm:num_requests_waiting"))

    def running(self, i: int) -> float:
        m = parse_metrics(httpx.get(self.replicas[i].url + "/metrics", timeout=5).text)
        return sum(v for k, v in m.items() if k.startswith("vllm:num_requests_running"))

    def up(self, *replicas: int) -> bool:
        """The gateway and these replicas are still running."""
        return self.gateway.popen.poll() is None and all(self.replicas[i].proc.poll() is None for i in replicas)

    def stop(self) -> None:
        self.gateway.stop()
        for r in self.replicas:
            if r.proc.poll() is None:
                os.kill(r.proc.pid, signal.SIGCONT)
            r.stop()


async def _until(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(cond) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def replica_killed(pair: ReplicaPair, when: str, seconds: float = 8.0) -> Tally:
    """SIGKILL replica 0 while streams are in flight (`mid-stream`), while requests wait in its queue
    (`mid-queue`), or while it prefills long prompts (`mid-prefill`). The other one takes over."""
    opts = {"workers": 4, "max_tokens": 48, "timeout": 30.0}
    if when == "mid-queue":
        opts = {"workers": 4, "max_tokens": 16, "timeout": 30.0, "pause_s": 0.0}
    if when == "mid-prefill":
        opts = {"workers": 4, "max_tokens": 4, "timeout": 30.0, "prompt": LONG_PROMPT}
    victim = pair.replicas[0]

    async def fault(clients: list[CountingClient], tally: Tally) -> None:
        await asyncio.sleep(2)
        if when == "mid-stream":
            await _until(lambda: clients[0].in_flight_streams >= 2)
        elif when == "mid-queue":
            await _until(lambda: pair.waiting(0) >= 1)
        else:
            await _until(lambda: pair.running(0) >= 1)
        victim.proc.send_signal(signal.SIGKILL)
        tally.fault_at = time.monotonic()
        await asyncio.sleep(seconds)

    tally = run_load([(pair.gateway.url, opts)], Tally(f"replica SIGKILL {when}"), fault, MODEL_NAME)
    tally.survivors_up = pair.up(1)
    return tally


def replica_frozen(pair: ReplicaPair, frozen_s: float = 6.0, seconds: float = 8.0) -> Tally:
    """SIGSTOP replica 0 mid-stream for `frozen_s`, then SIGCONT: its streams end with an error event once
    the idle-read timeout passes, the breaker ejects it, and it takes traffic again once resumed."""
    victim = pair.replicas[0]

    async def fault(clients: list[CountingClient], tally: Tally) -> None:
        await asyncio.sleep(2)
        await _until(lambda: clients[0].in_flight_streams >= 2)
        os.kill(victim.proc.pid, signal.SIGSTOP)
        tally.fault_at = time.monotonic()
        await asyncio.sleep(frozen_s)
        os.kill(victim.proc.pid, signal.SIGCONT)
        tally.healed_at = time.monotonic()
        await asyncio.sleep(seconds)

    tally = run_load([(pair.gateway.url, {"workers": 4, "max_tokens": 48})],
                     Tally(f"replica SIGSTOP mid-stream, SIGCONT after {frozen_s:g} s"), fault, MODEL_NAME)
    tally.survivors_up = pair.up(0, 1)
    return tally


def kv_cache_too_small(ckpt: str, seconds: float = 10.0) -> Tally:
    """One replica with 16 KV blocks (256 tokens): half the prompts can never fit (400 at once), the
    rest fit alone but not together (preempted and recomputed, all answered)."""
    secret = secrets.token_urlsafe(32)
    replica = ServerProcess(ckpt, "--kv-cache-memory", "0.000125", env={"ARGOSY_API_KEY": secret})
    gw = start_gateway({"gateway": REPLICA_GATEWAY, "models": [{"name": MODEL_NAME, "upstreams": [replica.url]}]},
                       env={"ARGOSY_UPSTREAM_API_KEY": secret})

    async def fault(clients, tally):  # the fault is there from the start; nothing to recover from
        await asyncio.sleep(seconds)

    fits = " ".join(f"w{i % 40}" for i in range(50))  # ~130 tokens: 11 blocks with 40 new tokens
    try:
        tally = run_load([(gw.url, {"workers": 2, "max_tokens": 8, "prompt": LONG_PROMPT}),
                          (gw.url, {"workers": 4, "max_tokens": 40, "prompt": fits})],
                         Tally("KV cache smaller than the prompts"), fault, MODEL_NAME)
        tally.survivors_up = gw.popen.poll() is None and replica.proc.poll() is None
        return tally
    finally:
        gw.stop()
        replica.stop()
