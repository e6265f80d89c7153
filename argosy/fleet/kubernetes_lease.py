"""Leader election over a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it: the
holder renews `renewTime` every third of the lease; another candidate takes the Lease once
`renewTime + leaseDurationSeconds` has passed. Only the leader starts replicas (KubernetesProvider.start).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging

log = logging.getLogger("argosy.fleet")


def _now() -> datetime.datetime:
    return datetime.datetime.now(tz=datetime.UTC)


def _stamp(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(s: str | None) -> datetime.datetime | None:
    if not s:
        return None
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))


class LeaseElector:
    def __init__(self, api_client, namespace: str, name: str, identity: str, duration_s: int):
        from kubernetes import client

        self.api = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity, self.duration = namespace, name, identity, duration_s
        self.leader = asyncio.Event()
        self.task: asyncio.Task | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.task = loop.create_task(self._run())

    async def wait_leader(self) -> None:
        await self.leader.wait()

    def try_acquire(self) -> bool:
        """One round: create, renew or take over the Lease; True if this identity holds it now."""
        from kubernetes.client.exceptions import ApiException

        now = _now()
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration, "renewTime": _stamp(now)}
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": self.name},
                    "spec": {**spec, "acquireTime": _stamp(now), "leaseTransitions": 0}}
            self.api.create_namespaced_lease(self.namespace, body)
            return True
        import json

        cur = json.loads(lease.data).get("spec") or {}
        renewed = _parse(cur.get("renewTime"))
        expired = renewed is None or (now - renewed).total_seconds() > cur.get("leaseDurationSeconds", self.duration)
        if cur.get("holderIdentity") not in (self.identity, None, "") and not expired:
            return False
        if cur.get("holderIdentity") != self.identity:
            spec.update(acquireTime=_stamp(now), leaseTransitions=int(cur.get("leaseTransitions") or 0) + 1)
        self.api.patch_namespaced_lease(self.name, self.namespace, {"spec": spec})
        return True

    async def _run(self) -> None:
        while True:
            try:
                held = await asyncio.to_thread(self.try_acquire)
            except Exception as e:  # the API is unreachable: a leader that cannot renew steps down
                log.warning("fleet: kubernetes: lease %s: %s", self.name, f"{type(e).__name__}: {e}"[:200])
                held = False
            if held != self.leader.is_set():
                log.info("fleet: kubernetes: %s %s the lease %s", self.identity, "holds" if held else "lost",
                         self.name)
                if held:
                    self.leader.set()
                else:
                    self.leader = asyncio.Event()
            await asyncio.sleep(self.duration / 3)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
