"""Upstreams found through DNS: a model's `discover: HOST:PORT` names a headless Service (Kubernetes
publishes one A record per ready pod). Every `gateway.health_interval_s` the name is resolved again;
each address becomes the upstream http://ADDRESS:PORT, added to the model's routing set when it
appears and removed when it leaves (a replica that turns unready or is deleted drops out of DNS).
A failed lookup keeps the current set: DNS trouble does not empty a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

log = logging.getLogger("argosy.gateway")
# getaddrinfo's answers for "this name has no address" (a headless Service with no ready pod).
NO_ADDRESS = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def split_target(target: str) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)


def upstream_url(address: str, port: int) -> str:
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


async def resolve(host: str, port: int) -> set[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return {upstream_url(info[4][0], port) for info in infos}


class Discovery:
    """Keeps each discovering model's upstreams equal to what its name resolves to."""

    def __init__(self, gateway: Any, period_s: float, resolver=resolve):
        self.gw, self.period, self.resolve = gateway, period_s, resolver
        self.found: dict[str, set[str]] = {}  # model -> upstream URLs it got from DNS
        self.task: asyncio.Task | None = None

    def models(self) -> list[tuple[str, str]]:
        return [(name, rt.cfg.discover) for name, rt in self.gw.models.items() if rt.cfg.discover]

    def start(self) -> None:
        if self.models():
            self.task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.period)

    async def refresh(self) -> None:
        for name, target in self.models():
            host, port = split_target(target)
            try:
                now = await self.resolve(host, port)
            except socket.gaierror as e:
                if e.errno not in NO_ADDRESS:  # a DNS outage, not an answer: keep what we have
                    log.warning("gateway: %s: discover %s: %s; keeping %d upstream(s)", name, target, e,
                                len(self.found.get(name, ())))
                    continue
                now = set()  # the name has no address: no replica is ready
            self.apply(name, now)

    def apply(self, name: str, now: set[str]) -> None:
        rt, before = self.gw.models[name], self.found.get(name, set())
        for url in sorted(now - before):
            rt.add_upstream(url)
            log.info("gateway: %s: upstream %s found", name, url)
        for url in sorted(before - now):
            rt.remove_upstream(url)
            if not any(url in {u.url for u in other.upstreams()} for other in self.gw.models.values()):
                self.gw.forget_upstream(url)  # its counters and scraped gauges go with it
            log.info("gateway: %s: upstream %s gone", name, url)
        self.found[name] = now

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
