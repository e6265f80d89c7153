"""The local admin credential: `argosy serve` (and `argosy gateway`) writes a fresh admin key for its owner
(mode 0600) at each start; the gateway accepts it on /admin/* from loopback clients only. So `argosy keys`
and `argosy status` on the same machine keep working after the first user key is created, with no admin
key set in the fleet file and no restart.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path


def credential_path() -> Path:
    """$ARGOSY_ADMIN_FILE, else $XDG_STATE_HOME/argosy/local-admin.json (~/.local/state/argosy/...)."""
    explicit = os.environ.get("ARGOSY_ADMIN_FILE")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "argosy" / "local-admin.json"


def issue(url: str) -> bytes:
    """Writes {url, key} readable by this user only; returns the key's SHA-256 for the gateway to compare."""
    key = f"sk-argosy-local-{secrets.token_urlsafe(24)}"
    path = credential_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "key": key}, f)
    os.replace(tmp, path)
    return hashlib.sha256(key.encode()).digest()


def read() -> dict | None:
    """The credential of the gateway last started by this user, or None."""
    try:
        data = json.loads(credential_path().read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("key"), str) else None
