"""The one reader of replicas' `/metrics`: it fetches, parses (prometheus_client's parser) and keeps each
replica's latest vllm:* load gauges (and how busy its devices are, for the dashboard).

Three consumers, one fetch path: the health checker scrapes the upstreams that routing weighs by
their gauges each round, the fleet controller refreshes its ready replicas' before each autoscaling
tick (the `queue` and `kv_cache` metrics), and the dashboard refreshes what it shows (at most once a
second). A refresh reuses a result younger than `max_age` and joins a fetch already under way, so the
three never scrape one replica twice at once. Every result also goes to `on_gauges(url, gauges)`: the
gateway writes it onto the routing state of that upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

# Gauges summed over every label set (one replica may serve several models).
GAUGES = {"vllm:num_requests_waiting": "waiting", "vllm:num_requests_running": "running",
          "vllm:kv_cache_usage_perc": "kv_usage"}
# The replica's devices (server/device_telemetry.py), read for the dashboard. Throttle reasons that do not
# slow a busy GPU (idle, clocks an operator set, the display) do not count as throttling.
DEVICE_SERIES = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_TOTAL", "argosy_gpu_throttle",
                 "argosy_host_cpu_usage_perc", "argosy_host_memory_used_bytes", "argosy_host_memory_total_bytes"}
BENIGN_THROTTLE = {"gpu_idle", "applications_clocks_setting", "display_clock_setting"}


def parse_gauges(text: bytes | str) -> dict[str, float]:
    """The load gauges found in a Prometheus text exposition ({"waiting": 3.0, "kv_usage": 0.5, ...}), and
    where the replica reports its devices: "device_busy" and "device_memory" (0..1: its busiest GPU and
    fullest GPU memory, else its host's CPU and memory) and "throttled" (1 when a GPU is throttled).

    A malformed line ends the parse: the gauges read before it are kept."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    out: dict[str, float] = {}
    device: dict[str, dict[str, float]] = {}  # series -> {gpu (or reason) label: value}
    with contextlib.suppress(ValueError, TypeError, IndexError):
        for fam in text_string_to_metric_families(text):
            key = GAUGES.get(fam.name)
            for s in fam.samples if key else ():
                out[key] = out.get(key, 0.0) + s.value
            for s in fam.samples if fam.name in DEVICE_SERIES else ():
                label = s.labels.get("gpu", "") + "/" + s.labels.get("reason", "")
                device.setdefault(fam.name, {})[label] = s.value
    out.update(device_gauges(device))
    return out


def device_gauges(device: dict[str, dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    util, used, total = (device.get(n, {}) for n in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED",
                                                     "DCGM_FI_DEV_FB_TOTAL"))
    if util:
        out["device_busy"] = max(util.values()) / 100
    elif "argosy_host_cpu_usage_perc" in device:
        out["device_busy"] = max(device["argosy_host_cpu_usage_perc"].values())
    if fractions := [used[g] / total[g] for g in used if total.get(g)]:
        out["device_memory"] = max(fractions)
    elif device.get("argosy_host_memory_total_bytes"):
        host_total = max(device["argosy_host_memory_total_bytes"].values())
        out["device_memory"] = max(device.get("argosy_host_memory_used_bytes", {"": 0.0}).values()) / host_total
    if "argosy_gpu_throttle" in device:
        out["throttled"] = float(any(v for label, v in device["argosy_gpu_throttle"].items()
                                     if label.split("/", 1)[1] not in BENIGN_THROTTLE))
    return out


@dataclass(frozen=True)
class ReplicaGauges:
    """One scrape of one replica: requests waiting and running, KV-cache usage (0..1), when (monotonic);
    its devices' use (parse_gauges), None where it reports none."""
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    at: float = 0.0
    device_busy: float | None = None
    device_memory: float | None = None
    throttled: float | None = None

    def as_dict(self) -> dict[str, float]:
        return {"waiting": self.waiting, "running": self.running, "kv_usage": self.kv_usage}


class ReplicaScraper:
    def __init__(self, session: Callable[[], aiohttp.ClientSession | None], timeout_s: float,
                 on_gauges: Callable[[str, ReplicaGauges], None] | None = None, clock=time.monotonic):
        self.session, self.on_gauges, self.clock = session, on_gauges, clock
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.latest: dict[str, ReplicaGauges] = {}
        self.pending: dict[str, asyncio.Future] = {}

    def get(self, url: str) -> ReplicaGauges | None:
        return self.latest.get(url)

    def forget(self, url: str) -> None:
        """A replica that went away: a later one on the same address starts with no gauges."""
        self.latest.pop(url, None)

    async def scrape(self, url: str) -> ReplicaGauges | None:
        """Fetch and parse one replica's gauges now (joining a fetch already under way). None when it answered
        with an error status; a connection error or a timeout is raised (the health checker counts it)."""
        fut = self.pending.get(url)
        if fut is None:
            fut = self.pending[url] = asyncio.ensure_future(self._fetch(url))
            fut.add_done_callback(lambda f, u=url: self._done(u, f))
        return await asyncio.shield(fut)  # one caller cancelled does not cancel the others' fetch

    def _done(self, url: str, fut: asyncio.Future) -> None:
        self.pending.pop(url, None)
        if not fut.cancelled():
            fut.exception()  # retrieved here: every caller may have gone away

    async def refresh(self, urls: Iterable[str], max_age: float = 0.0) -> dict[str, ReplicaGauges]:
        """Each replica's gauges no older than `max_age` seconds (scraped now where needed); a replica that
        did not answer is left out."""
        now = self.clock()
        urls = list(dict.fromkeys(urls))
        stale = [u for u in urls if (g := self.latest.get(u)) is None or now - g.at > max_age]
        if stale:  # a replica that does not answer in time shows no (new) gauges
            await asyncio.gather(*(self.scrape(u) for u in stale), return_exceptions=True)
        return {u: self.latest[u] for u in urls if u in self.latest}

    async def _fetch(self, url: str) -> ReplicaGauges | None:
        session = self.session()
        if session is None:
            return None
        async with session.get(url + "/metrics", timeout=self.timeout) as r:
            if r.status != 200:
                return None
            g = parse_gauges(await r.read())
        gauges = ReplicaGauges(g.get("waiting", 0.0), g.get("running", 0.0), g.get("kv_usage", 0.0), self.clock(),
                               g.get("device_busy"), g.get("device_memory"), g.get("throttled"))
        self.latest[url] = gauges
        if self.on_gauges is not None:
            self.on_gauges(url, gauges)
        return gauges
