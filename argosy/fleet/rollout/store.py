"""Where the rollout state lives: Redis when the fleet has `gateway.redis_url` (every gateway and a
restarted controller read the same), else a JSON file written atomically (a temporary file in the same
folder, fsynced, then renamed over the old one: a crash leaves the old state or the new, never half).

The file's default place is ~/.local/state/argosy/ ($XDG_STATE_HOME/argosy), one file per fleet file
(named from a hash of its absolute path); `state_file` in the fleet file sets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

REDIS_KEY = "argosy:rollout:{model}"


class StateStore(Protocol):
    async def load(self, model: str) -> dict[str, Any] | None: ...

    async def save(self, model: str, state: dict[str, Any]) -> None: ...

    async def close(self) -> None: ...


def default_state_path(fleet_file: str | None) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "argosy"
    if fleet_file is None:
        return base / "default.json"
    digest = hashlib.sha256(str(Path(fleet_file).resolve()).encode()).hexdigest()[:12]
    return base / f"fleet-{Path(fleet_file).stem}-{digest}.json"


class FileStore:
    """All models' state in one JSON file: {"models": {name: state}}."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.lock = asyncio.Lock()

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"models": {}}
        except OSError as e:  # its folder is a file, no permission
            raise ValueError(f"{self.path}: the rollout state file cannot be read ({e.strerror or e}); set "
                             "state_file in the fleet file to a path this process can write") from None
        except ValueError as e:
            raise ValueError(f"{self.path}: the rollout state file is not valid JSON ({e}); move it away to "
                             "start from the fleet file's revisions") from None
        return data if isinstance(data, dict) and isinstance(data.get("models"), dict) else {"models": {}}

    def _write(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        with contextlib.suppress(OSError):  # the rename itself durable
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def check(self) -> None:
        """Raises ValueError, in words, when the file is there but cannot be read as a state file."""
        self._read()

    async def load(self, model: str) -> dict[str, Any] | None:
        async with self.lock:
            return (await asyncio.to_thread(self._read))["models"].get(model)

    async def save(self, model: str, state: dict[str, Any]) -> None:
        async with self.lock:
            def update() -> None:
                data = self._read()
                data["models"][model] = state
                self._write(data)
            await asyncio.to_thread(update)

    async def close(self) -> None:
        pass


class RedisStore:
    def __init__(self, url: str):
        import redis.asyncio as aioredis

        self.redis = aioredis.from_url(url)

    async def load(self, model: str) -> dict[str, Any] | None:
        raw = await self.redis.get(REDIS_KEY.format(model=model))
        return json.loads(raw) if raw else None

    async def save(self, model: str, state: dict[str, Any]) -> None:
        await self.redis.set(REDIS_KEY.format(model=model), json.dumps(state, sort_keys=True))

    async def close(self) -> None:
        await self.redis.aclose()


def make_store(redis_url: str | None, path: str | Path) -> StateStore:
    return RedisStore(redis_url) if redis_url else FileStore(path)
