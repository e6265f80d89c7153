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
from urllib.parse import urlsplit


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


def key_for(url: str) -> str | None:
    """The credential's key when `url` is the gateway that wrote it: its own URL, or the same scheme and port
    on a loopback address when it listens on loopback or on every address (a gateway on 0.0.0.0 writes
    http://0.0.0.0:PORT, and is reached as 127.0.0.1:PORT). None otherwise: a key is not sent elsewhere."""
    from argosy.gateway.admin import is_loopback

    cred = read()
    if cred is None:
        return None
    if cred.get("url", "").rstrip("/") == url.rstrip("/"):
        return cred["key"]
    written, asked = urlsplit(cred.get("url", "")), urlsplit(url)
    try:
        same_port = written.port is not None and (written.scheme, written.port) == (asked.scheme, asked.port)
    except ValueError:  # a port that is no number
        return None
    listens_here = is_loopback(written.hostname or "") or written.hostname in ("0.0.0.0", "::")
    return cred["key"] if same_port and listens_here and is_loopback(asked.hostname or "") else None
