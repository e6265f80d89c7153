"""Three regions in network namespaces for tests/test_regions_netns.py: eu-west and eu-north (jurisdiction eu,
each an `argosy gateway` over a fixture replica of `chat`) and us-east (jurisdiction us, `argosy serve`:
a fixture replica of `chat` and two `tiny` engine replicas its controller places on on-demand and spot
nodes). Round trips between them: eu-west/eu-north 80 ms, eu-west/us-east 150 ms, eu-north/us-east 180 ms.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import yaml

from argosy.gateway.keys import new_key
from tests.netns_regions import NetnsRegions

REGIONS = ["eu-west", "eu-north", "us-east"]
JURISDICTION = {"eu-west": "eu", "eu-north": "eu", "us-east": "us"}
RTT_MS = {"eu-west": {"eu-north": 80, "us-east": 150}, "eu-north": {"us-east": 180}}
ENTRIES = {"eu-west": ["eu-west", "eu-north", "us-east"], "eu-north": ["eu-north", "eu-west", "us-east"],
           "us-east": ["us-east", "eu-west", "eu-north"]}  # users' failover: nearest first
FIXTURE_PORT = 9001
FIXTURE_TTFT_S = 0.05
SECRET = "regions-test-secret-0123456789abcdef"
CAPACITY_PER_REGION = 4  # chat: one replica x autoscaling.target 4: the fifth request in flight spills
HOLD_DOWN_S, RAMP_S = 3.0, 3.0


class RegionsUnderTest:
    def __init__(self, workdir: Path, tiny_checkpoint: str):
        self.workdir = workdir
        self.net = NetnsRegions(REGIONS, RTT_MS, workdir, ENTRIES)
        self.keys = {}
        user, user_hash = new_key()
        pinned, pinned_hash = new_key()
        admin, admin_hash = new_key()
        self.keys = {"user": user, "eu-pinned": pinned, "admin": admin}
        self.fleet = {
            "gateway": {"health_interval_s": 0.5, "eject_after_failures": 2, "eject_for_s": 2.0},
            "keys": [{"name": "user", "hash": user_hash},
                     {"name": "eu-pinned", "hash": pinned_hash, "residency": "eu"}],
            "admin_key_hash": admin_hash,
            "regions": [self.region(name) for name in REGIONS],
            "region_routing": {"exchange_interval_s": 0.5, "stale_after_s": 2.0, "hold_down_s": HOLD_DOWN_S,
                               "ramp_s": RAMP_S, "residency_header": "x-argosy-residency"},
            "models": [
                {"name": "chat", "upstreams": [f"http://127.0.0.1:{FIXTURE_PORT}"],
                 "autoscaling": {"target": CAPACITY_PER_REGION}},
                # chat-us runs only in us-east: another region's gateway forwards it (the hop's cost, test g)
                {"name": "chat-us", "regions": ["us-east"], "upstreams": [f"http://127.0.0.1:{FIXTURE_PORT}"]},
                {"name": "tiny", "checkpoint": tiny_checkpoint, "regions": ["us-east"],
                 "engine": {"kv_cache_memory_gib": 0.01, "max_num_seqs": 16, "max_num_batched_tokens": 256},
                 "autoscaling": {"min_replicas": 2, "max_replicas": 2, "target": 8, "tick_s": 0.5,
                                 "drain_timeout_s": 60, "restart_backoff_s": 0.5},
                 "admission": {"queue_timeout_s": 60}}]}
        self.config = workdir / "fleet.yaml"
        self.config.write_text(yaml.safe_dump(self.fleet))

    def region(self, name: str) -> dict:
        r = {"name": name, "provider": {"eu-west": "gcp", "eu-north": "aws", "us-east": "onprem"}[name],
             "location": name, "jurisdiction": JURISDICTION[name], "gateway": self.net.gateway_url(name),
             "upstreams": {"chat": [f"http://127.0.0.1:{FIXTURE_PORT}"]},
             "capacity": {"on_demand": {"gpu": "cpu", "count": 4, "usd_per_hour": 0.40}}}
        if name == "us-east":  # the tiny engine replicas: one on on-demand, the burst on spot
            r["upstreams"]["chat-us"] = [f"http://127.0.0.1:{FIXTURE_PORT}"]
            r["nodes"] = [{"name": "us-od", "capacity": "on_demand", "memory_gib": 0.6},
                          {"name": "us-spot-a", "capacity": "spot", "memory_gib": 0.6},
                          {"name": "us-spot-b", "capacity": "spot", "memory_gib": 0.6}]
            r["capacity"] = {"on_demand": {"gpu": "cpu", "count": 1, "usd_per_hour": 0.40},
                             "spot": {"gpu": "cpu", "count": 2, "usd_per_hour": 0.12}}
        return r

    # ------------------------------------------------------------------ processes

    def start(self) -> None:
        relays = {}
        for name in REGIONS:
            i = self.net.index[name]
            relays[f"gw-{name}"] = (f"10.250.{i}.2", 8000)
            relays[f"fx-{name}"] = (f"10.250.{i}.2", FIXTURE_PORT)
        self.net.up(relays)
        for name in REGIONS:
            self.start_region(name)
        for name in REGIONS:
            self.wait_ready(name)
        # us-east's tiny replicas started with it: measure nothing while they load (2 CPU cores)
        self.wait("us-east's two tiny replicas", lambda: sum(
            r["state"] == "ready" for m in self.fleet_status()["models"] if m["model"] == "tiny"
            for r in m["replicas"]) == 2, timeout=180, every=0.5)

    def start_fixture(self, name: str) -> None:
        self.net.run(f"fixture-{name}", self.net.ns[name], [
            sys.executable, "-m", "argosy.bench.fixture_server", "--host", "0.0.0.0", "--port", str(FIXTURE_PORT),
            "--ttft", str(FIXTURE_TTFT_S), "--token-delay", "0.01", "--model", "chat"])

    def start_region(self, name: str) -> None:
        ns = self.net.ns[name]
        self.start_fixture(name)
        cmd = "serve" if name == "us-east" else "gateway"
        self.net.run(f"gateway-{name}", ns, [sys.executable, "-m", "argosy.cli", cmd, "--config", str(self.config),
                                             "--region", name, "--host", "0.0.0.0", "--port", "8000"],
                     env={"ARGOSY_REGION_SECRET": SECRET})

    def wait_ready(self, name: str, timeout: float = 90.0) -> None:
        self.net.wait_http(f"fx-{name}", "/health", timeout=timeout, label=f"fixture-{name}")
        self.net.wait_http(f"gw-{name}", "/health", timeout=timeout, label=f"gateway-{name}")
        # Every other region in, for chat (exchanges every 0.5 s).
        self.net.wait_http(f"gw-{name}", "/admin/regions", label=f"gateway-{name}", timeout=timeout,
                           headers=self.headers(),
                           ok=lambda r: r.status_code == 200 and all(
                               u["state"] == "in" for u in r.json()["models"]["chat"]))

    def wait_all_in(self, timeout: float = 60.0) -> None:
        """Every gateway sees every region in (for chat): after a failure, past the hold-down and the ramp."""
        for name in REGIONS:
            self.wait(f"{name} to see every region in", lambda name=name: all(
                u["state"] == "in" for u in self.regions_view(name)["models"]["chat"]), timeout)

    def admin(self, name: str):
        return self.net.http(f"gw-{name}")

    def headers(self) -> dict:
        return {"authorization": f"Bearer {self.keys['admin']}"}

    def regions_view(self, name: str) -> dict:
        with self.admin(name) as c:
            return c.get("/admin/regions", headers=self.headers()).json()

    def fleet_status(self, name: str = "us-east") -> dict:
        with self.admin(name) as c:
            return c.get("/admin/fleet", headers=self.headers()).json()

    def fixture_stats(self, name: str) -> dict:
        with self.net.http(f"fx-{name}") as c:
            return c.get("/stats").json()

    def wait(self, what: str, cond, timeout: float = 60.0, every: float = 0.2):
        t0 = time.monotonic()
        while True:
            got = cond()
            if got:
                return got
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(every)

    def stop(self) -> None:
        self.net.down()
