"""The key pepper: the server-side secret that API-key hashes are keyed with (HMAC-SHA256).

Where the gateway finds it, first match wins:
1. `ARGOSY_KEY_PEPPER` (the secret itself): containers, Kubernetes secrets, several gateways alike;
2. the file `gateway.key_pepper_file` names (relative to the fleet file);
3. `$XDG_CONFIG_HOME/argosy/key-pepper` (`~/.config/argosy/key-pepper`).
`argosy keys add` creates the file of 2 or 3 (mode 0600) when none exists, so the first key just works
on the machine that made it; a gateway elsewhere needs the same pepper (copy the file, or set the
variable). A stored hash names its pepper by a short id, so a gateway with the wrong one says so at
start instead of refusing every key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

PEPPER_ENV = "ARGOSY_KEY_PEPPER"
MIN_CHARS = 16


class PepperError(ValueError):
    """No usable pepper where one is needed; the message says where to put it."""


def default_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "argosy" / "key-pepper"


def pepper_path(configured: str | None, fleet_file: str | None = None) -> Path:
    if configured is None:
        return default_path()
    p = Path(configured).expanduser()
    if not p.is_absolute() and fleet_file:
        p = Path(fleet_file).resolve().parent / p
    return p


def load_pepper(path: Path, create: bool = False) -> tuple[bytes | None, str]:
    """(the pepper, where it came from); (None, where it was looked for) when absent and not created."""
    env = os.environ.get(PEPPER_ENV)
    if env is not None:
        if len(env.strip()) < MIN_CHARS:
            raise PepperError(f"{PEPPER_ENV} is set but shorter than {MIN_CHARS} characters")
        return env.strip().encode(), PEPPER_ENV
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        if not create:
            return None, str(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = secrets.token_hex(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
    except OSError as e:
        raise PepperError(f"cannot read the key pepper {path}: {e.strerror}") from None
    if len(text) < MIN_CHARS:
        raise PepperError(f"the key pepper {path} is shorter than {MIN_CHARS} characters")
    return text.encode(), str(path)


def pepper_id(pepper: bytes) -> str:
    """A short public name of a pepper, stored in each hash: tells a wrong pepper from a wrong key."""
    return hmac.new(pepper, b"argosy key pepper id", hashlib.sha256).hexdigest()[:8]


def fleet_pepper(fleet_file: Path) -> bytes:
    """The pepper for keys written to this fleet file (its `gateway.key_pepper_file`, else the default),
    made when there is none yet (said once on stderr)."""
    import sys

    import yaml

    try:
        data = yaml.safe_load(fleet_file.read_text()) if fleet_file.exists() else None
    except (OSError, yaml.YAMLError):
        data = None
    gateway = (data or {}).get("gateway") if isinstance(data, dict) else None
    where = pepper_path((gateway or {}).get("key_pepper_file") if isinstance(gateway, dict) else None, str(fleet_file))
    existed = where.exists()
    pepper, source = load_pepper(where, create=True)
    if source == str(where) and not existed:
        print(f"argosy keys: created the key pepper {where} (mode 600). Key hashes are keyed with it: a gateway "
              f"on another machine needs the same pepper (copy the file, or set {PEPPER_ENV})", file=sys.stderr)
    return pepper
