"""The local admin credential: `argosy serve` (and `argosy gateway`) writes a fresh admin key for its owner
(mode 0600) at each start; the gateway accepts it on /admin/* from loopback clients only. So `argosy keys`
and `argosy status` on the same machine keep working after the first user key is created, with no admin
key set in the fleet file and no restart.

One file holds an entry per running gateway (its URL, key and process id), newest last: a second `argosy
serve` on another port had replaced the first one's, which then refused its owner's `argosy status`. A
gateway takes its entry out when it exits; one that was killed is dropped by the next gateway to start, and
skipped by readers meanwhile.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

MAX_ENTRIES = 32  # gateways kept in the file (a machine runs a few; dead ones are dropped anyway)


def credential_path() -> Path:
    """$ARGOSY_ADMIN_FILE, else $XDG_STATE_HOME/argosy/local-admin.json (~/.local/state/argosy/...)."""
    explicit = os.environ.get("ARGOSY_ADMIN_FILE")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "argosy" / "local-admin.json"


def _alive(pid) -> bool:
    if not isinstance(pid, int):
        return True  # an entry written before process ids were kept
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process now: the file is this user's, so its gateway is gone
    return True


def _entries() -> list[dict]:
    """Every entry of the file whose gateway may still run, oldest first; the file as written before
    2026-12-06 ({url, key}) is one entry."""
    try:
        data = json.loads(credential_path().read_text())
    except (OSError, ValueError):
        return []
    found = data.get("gateways", [data]) if isinstance(data, dict) else []
    return [e for e in found if isinstance(e, dict) and isinstance(e.get("key"), str)
            and isinstance(e.get("url"), str) and _alive(e.get("pid"))]


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    """The credential file, with no other gateway rewriting it meanwhile (two started together)."""
    path = credential_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path.with_suffix(".lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)


def _write(path: Path, entries: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"gateways": entries[-MAX_ENTRIES:]}, f)
    os.replace(tmp, path)


def issue(url: str) -> bytes:
    """Adds {url, key, pid} readable by this user only (replacing an entry for the same URL); returns the key's
    SHA-256 for the gateway to compare."""
    key = f"sk-argosy-local-{secrets.token_urlsafe(24)}"
    with _locked() as path:
        entries = [e for e in _entries() if e["url"].rstrip("/") != url.rstrip("/")]
        _write(path, [*entries, {"url": url, "key": key, "pid": os.getpid()}])
    return hashlib.sha256(key.encode()).digest()


def withdraw(url: str) -> None:
    """Takes this process's entry for `url` out of the file (the gateway is stopping). Never raises."""
    with contextlib.suppress(OSError), _locked() as path:
        entries = _entries()
        kept = [e for e in entries if not (e["url"] == url and e.get("pid") == os.getpid())]
        if len(kept) != len(entries):
            _write(path, kept)


def read() -> dict | None:
    """The credential of the gateway last started by this user that may still run, or None."""
    entries = _entries()
    return entries[-1] if entries else None


def default_url() -> str:
    """The gateway commands on this machine talk to without --url: the newest `argosy serve` / `argosy gateway`
    still running (`argosy keys` found it, `argosy status` and `argosy rollout` had tried :8000 whatever ran)."""
    entry = read()
    return entry["url"] if entry and entry.get("url") else "http://127.0.0.1:8000"


def key_for(url: str) -> str | None:
    """The key of the gateway at `url`: the entry with that URL, or with the same scheme and port on a loopback
    address when it listens on loopback or on every address (a gateway on 0.0.0.0 writes
    http://0.0.0.0:PORT, and is reached as 127.0.0.1:PORT). None otherwise: a key is not sent elsewhere."""
    from argosy.gateway.admin import is_loopback

    entries = list(reversed(_entries()))  # the newest first
    for cred in entries:
        if cred["url"].rstrip("/") == url.rstrip("/"):
            return cred["key"]
    asked = urlsplit(url)
    for cred in entries:
        written = urlsplit(cred["url"])
        try:
            same_port = written.port is not None and (written.scheme, written.port) == (asked.scheme, asked.port)
        except ValueError:  # a port that is no number
            continue
        listens_here = is_loopback(written.hostname or "") or written.hostname in ("0.0.0.0", "::")
        if same_port and listens_here and is_loopback(asked.hostname or ""):
            return cred["key"]
    return None
