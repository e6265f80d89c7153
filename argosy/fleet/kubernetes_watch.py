"""What the Kubernetes provider knows of its cluster: the replica pods of one controller (by its label)
and the Nodes, each kept by a watch thread that re-lists every `resync_s` and after any error. Every
change wakes the asyncio side (`until`), which reads the tables; only the threads write them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time

from argosy.config_providers import KubernetesProviderOptions

log = logging.getLogger("argosy.fleet")


class ClusterWatch:
    """Pods (this controller's) and Nodes as last seen, in the API's JSON shape."""

    def __init__(self, opts: KubernetesProviderOptions, namespace: str, selector: str):
        self.opts, self.namespace, self.selector = opts, namespace, selector
        self.core = None
        self.pods: dict[str, dict] = {}  # pod name -> its last seen object
        self.k8s_nodes: dict[str, dict] = {}
        self.seen_nodes: set[str] = set()  # every node ever listed: one that went away stays down
        self.loop: asyncio.AbstractEventLoop | None = None
        self.changed = asyncio.Event()
        self.closing = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, core, loop: asyncio.AbstractEventLoop) -> None:
        """List both kinds once (blocking: call it in a thread), then watch each in a thread of its own."""
        self.core, self.loop = core, loop
        for kind in ("pods", "nodes"):
            self._relist(kind)
            t = threading.Thread(target=self._watch, args=(kind,), name=f"argosy-k8s-{kind}", daemon=True)
            t.start()
            self.threads.append(t)

    async def stop(self) -> None:
        self.closing.set()
        self.wake()
        for t in self.threads:  # each leaves at its next event or read timeout (resync_s)
            await asyncio.to_thread(t.join, self.opts.resync_s + 2)

    def _relist(self, kind: str) -> str:
        if kind == "pods":
            data = json.loads(self.core.list_namespaced_pod(self.namespace, label_selector=self.selector,
                                                            _preload_content=False, _request_timeout=30).data)
            self.pods = {o["metadata"]["name"]: o for o in data.get("items", []) if self._ours(o)}
        else:
            data = json.loads(self.core.list_node(_preload_content=False, _request_timeout=30).data)
            self.k8s_nodes = {o["metadata"]["name"]: o for o in data.get("items", [])}
            self.seen_nodes |= set(self.k8s_nodes)
        self._notify()
        return (data.get("metadata") or {}).get("resourceVersion", "")

    def _watch(self, kind: str) -> None:
        from kubernetes import watch

        while not self.closing.is_set():
            try:
                version = self._relist(kind)
                if kind == "pods":
                    fn = self.core.list_namespaced_pod
                    kw = {"namespace": self.namespace, "label_selector": self.selector}
                else:
                    fn, kw = self.core.list_node, {}
                w = watch.Watch()
                # The server ends the stream after timeout_seconds; the read timeout covers one that does not.
                for ev in w.stream(fn, resource_version=version or None, _request_timeout=(10, self.opts.resync_s + 1),
                                   timeout_seconds=max(1, int(self.opts.resync_s)), **kw):
                    if self.closing.is_set():
                        w.stop()
                        break
                    self._apply(kind, ev["type"], ev["raw_object"])
            except Exception as e:  # the API went away, a 410 Gone, a reset: re-list and watch again
                if self._read_timeout(e):
                    continue
                if not self.closing.is_set():
                    log.warning("fleet: kubernetes: %s watch: %s; re-listing", kind, f"{type(e).__name__}: {e}"[:200])
                    self.closing.wait(1.0)

    @staticmethod
    def _read_timeout(e: Exception) -> bool:
        return "ReadTimeout" in type(e).__name__ or "timed out" in str(e)

    def _ours(self, pod: dict) -> bool:
        """The label selector, checked here too (a watch or list that ignored it must not mix controllers)."""
        key, value = self.selector.split("=", 1)
        return ((pod.get("metadata") or {}).get("labels") or {}).get(key) == value

    def _apply(self, kind: str, event: str, obj: dict) -> None:
        if kind == "pods" and not self._ours(obj):
            return
        table = self.pods if kind == "pods" else self.k8s_nodes
        name = obj["metadata"]["name"]
        if event == "DELETED":
            table.pop(name, None)
        elif event in ("ADDED", "MODIFIED"):
            table[name] = obj
            if kind == "nodes":
                self.seen_nodes.add(name)
        self._notify()

    def _notify(self) -> None:
        if self.loop is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.wake)

    def wake(self) -> None:
        ev, self.changed = self.changed, asyncio.Event()
        ev.set()

    async def until(self, cond, timeout: float) -> bool:
        """Wait until cond() holds, re-checking at every change (and every resync_s); False after `timeout`."""
        deadline = time.monotonic() + timeout
        while not cond():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, self.opts.resync_s))
        return True
