"""The network between the test's regions, run inside the hub namespace (tests/netns_regions.py):

- a latency-injecting TCP proxy per region, on its service address (10.250.0.N:PORT, the `gateway` URL
  the fleet file gives): a connection from region M's namespace (source 10.250.M.2) to region N gets half
  the M-N round trip added each way, chunk by chunk (order kept). A link can be black-holed (bytes are
  swallowed, connections hang) or dropped (connections reset).
- an entry per region, on a unix socket (the test process is outside every namespace; a path-based unix
  socket is reachable from any): the users of region N and what stands in for DNS/anycast in front of
  the regions. Each connection goes to N's gateway, or, if it refuses, to the next region in the entry's
  order (nearest first).
- relays on unix sockets to any address in the namespaces (the test reads admin APIs and counters).
- a control socket: {"cmd": "delay"|"blackhole"|"drop", "src", "dst", "ms"|"on"} one JSON line each.

    python tests/netns_hub.py CONFIG.json     (CONFIG: see NetnsRegions.hub_config)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time


class Link:
    def __init__(self, rtt_ms: float):
        self.one_way = rtt_ms / 2000.0
        self.blackhole = False
        self.drop = False


class Hub:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.by_source = {f"10.250.{r['index']}.2": name for name, r in cfg["regions"].items()}
        self.links: dict[tuple[str, str], Link] = {}
        for src in cfg["regions"]:
            for dst in cfg["regions"]:
                if src != dst:
                    self.links[(src, dst)] = Link(cfg["rtt_ms"].get(src, {}).get(dst) or cfg["rtt_ms"][dst][src])

    async def pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link | None) -> None:
        """Copy one direction with the link's one-way delay (each chunk leaves `delay` after it came)."""
        queue: asyncio.Queue = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if link is not None and link.blackhole:
                    continue
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                queue.put_nowait((time.monotonic() + (link.one_way if link else 0.0), data))
            queue.put_nowait((0.0, None))
            await sender
        except (ConnectionError, OSError):
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(Exception):
                writer.close()

    async def splice(self, client_r, client_w, up_r, up_w, link: Link | None) -> None:
        await asyncio.gather(self.pump(client_r, up_w, link), self.pump(up_r, client_w, link),
                             return_exceptions=True)

    # ------------------------------------------------------------------ between regions

    def region_proxy(self, dst: str):
        target = self.cfg["regions"][dst]

        async def handle(reader, writer) -> None:
            src = self.by_source.get(writer.get_extra_info("peername")[0])
            link = self.links.get((src, dst)) if src else None
            if link is not None and link.drop:
                writer.transport.abort()
                return
            try:
                up_r, up_w = await asyncio.open_connection(f"10.250.{target['index']}.2", target["gateway_port"])
            except OSError:
                writer.transport.abort()
                return
            await self.splice(reader, writer, up_r, up_w, link)
        return handle

    # ------------------------------------------------------------------ the users' entries and relays

    def entry(self, order: list[str]):
        async def handle(reader, writer) -> None:
            for name in order:
                r = self.cfg["regions"][name]
                try:
                    up_r, up_w = await asyncio.open_connection(f"10.250.{r['index']}.2", r["gateway_port"])
                except OSError:
                    continue
                await self.splice(reader, writer, up_r, up_w, None)
                return
            writer.transport.abort()
        return handle

    def relay(self, host: str, port: int):
        async def handle(reader, writer) -> None:
            try:
                up_r, up_w = await asyncio.open_connection(host, port)
            except OSError:
                writer.transport.abort()
                return
            await self.splice(reader, writer, up_r, up_w, None)
        return handle

    async def control(self, reader, writer) -> None:
        while line := await reader.readline():
            try:
                cmd = json.loads(line)
                link = self.links[(cmd["src"], cmd["dst"])]
                if cmd["cmd"] == "delay":
                    link.one_way = cmd["ms"] / 2000.0
                elif cmd["cmd"] == "blackhole":
                    link.blackhole = bool(cmd["on"])
                elif cmd["cmd"] == "drop":
                    link.drop = bool(cmd["on"])
                writer.write(b"ok\n")
            except (ValueError, KeyError) as e:
                writer.write(f"error {e}\n".encode())
            await writer.drain()
        writer.close()

    async def run(self) -> None:
        servers = []
        d = self.cfg["sockdir"]
        for name, r in self.cfg["regions"].items():
            servers.append(await asyncio.start_server(self.region_proxy(name), f"10.250.0.{r['index']}",
                                                      self.cfg["service_port"], backlog=1024))
            servers.append(await asyncio.start_unix_server(self.entry(self.cfg["entries"][name]),
                                                           os.path.join(d, f"entry-{name}.sock"), backlog=1024))
        for relay_name, (host, port) in self.cfg["relays"].items():
            servers.append(await asyncio.start_unix_server(self.relay(host, port),
                                                           os.path.join(d, f"relay-{relay_name}.sock")))
        servers.append(await asyncio.start_unix_server(self.control, os.path.join(d, "control.sock")))
        print("hub ready", flush=True)
        await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        asyncio.run(Hub(json.load(f)).run())
