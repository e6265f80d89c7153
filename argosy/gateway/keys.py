"""API keys: generated once, stored only as scrypt hashes, compared in constant time.

A key reads `sk-argosy-<id>-<secret>`; its stored hash is `scrypt:<id>:<n>:<r>:<p>:<salt>:<digest>`.
The id (not secret) picks the one record to check, so a lookup costs one scrypt, not one per key.
A verified key is then cached under the SHA-256 of the full key: later requests cost a dict lookup
on a digest, which leaks nothing about the secret through timing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from argosy.config import KeyConfig

N, R, P = 2**14, 8, 1  # scrypt cost: ~16 MiB, tens of ms, paid once per key per gateway process


@dataclass
class KeyRecord:
    name: str
    hash: str
    models: list[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    priority: str = "interactive"
    budget_usd: float | None = None  # spend (the price book's rates) past which the key gets 429
    expires_at: float | None = None  # Unix time after which the key gets 401
    source: str = "fleet"  # fleet (the fleet file) or admin (added at run time)
    created_at: float | None = None
    residency: str | None = None  # the jurisdiction its requests stay in (multi-region fleets, docs/regions.md)

    @classmethod
    def from_config(cls, k: KeyConfig) -> KeyRecord:
        expires = k.expires_at.timestamp() if k.expires_at is not None else None
        return cls(k.name, k.hash, k.models, k.rpm, k.tpm, k.priority, k.budget_usd, expires, residency=k.residency)

    def public(self) -> dict:
        return {"name": self.name, "models": self.models, "rpm": self.rpm, "tpm": self.tpm,
                "priority": self.priority, "budget_usd": self.budget_usd, "expires_at": self.expires_at,
                "source": self.source, "created_at": self.created_at, "residency": self.residency}

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now or time.time()) >= self.expires_at

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> KeyRecord:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in fields})


def new_key() -> tuple[str, str]:
    """A fresh key and its stored hash."""
    kid = secrets.token_hex(4)
    key = f"sk-argosy-{kid}-{secrets.token_urlsafe(24)}"
    return key, hash_key(key)


def _split(key: str) -> tuple[str, str] | None:
    parts = key.split("-", 3)
    if len(parts) != 4 or parts[0] != "sk" or parts[1] != "argosy":
        return None
    return parts[2], parts[3]


def hash_key(key: str) -> str:
    kid, _ = _split(key) or ("", "")
    salt = secrets.token_bytes(16)
    dk = hashlib.scrypt(key.encode(), salt=salt, n=N, r=R, p=P, dklen=32)
    return f"scrypt:{kid}:{N}:{R}:{P}:{salt.hex()}:{dk.hex()}"


def hash_id(stored: str) -> str | None:
    parts = stored.split(":")
    return parts[1] if len(parts) == 7 and parts[0] == "scrypt" else None


def verify(key: str, stored: str) -> bool:
    parts = stored.split(":")
    if len(parts) != 7 or parts[0] != "scrypt":
        return False
    n, r, p = int(parts[2]), int(parts[3]), int(parts[4])
    dk = hashlib.scrypt(key.encode(), salt=bytes.fromhex(parts[5]), n=n, r=r, p=p, dklen=32, maxmem=2**27)
    return hmac.compare_digest(dk, bytes.fromhex(parts[6]))


class KeyStore:
    def __init__(self, keys: list[KeyRecord], admin_hash: str | None = None):
        self.by_id: dict[str, KeyRecord] = {}
        self.admin_hash = admin_hash
        for k in keys:
            self.add(k)
        self.verified: dict[bytes, KeyRecord] = {}
        self.rejected: OrderedDict[bytes, None] = OrderedDict()  # bounded: a wrong key costs one scrypt

    def add(self, k: KeyRecord) -> None:
        kid = hash_id(k.hash)
        if kid is None:
            raise ValueError(f"key {k.name!r}: hash is not an argosy scrypt hash")
        self.by_id[kid] = k

    def remove(self, name: str) -> bool:
        for kid, k in list(self.by_id.items()):
            if k.name == name:
                del self.by_id[kid]
                self.verified = {d: r for d, r in self.verified.items() if r.name != name}
                return True
        return False

    def replace_all(self, keys: list[KeyRecord]) -> None:
        """The whole set at once (a reload): verified keys that are gone or changed are forgotten."""
        by_id = {}
        for k in keys:
            kid = hash_id(k.hash)
            if kid is not None:
                by_id[kid] = k
        self.by_id = by_id
        live = {id(k) for k in by_id.values()}
        self.verified = {d: r for d, r in self.verified.items() if id(r) in live}

    def named(self, name: str) -> KeyRecord | None:
        return next((k for k in self.by_id.values() if k.name == name), None)

    @property
    def empty(self) -> bool:
        return not self.by_id

    def lookup(self, key: str) -> KeyRecord | None:
        d = hashlib.sha256(key.encode()).digest()
        rec = self.verified.get(d)
        if rec is not None or d in self.rejected:
            return rec
        split = _split(key)
        rec = self.by_id.get(split[0]) if split else None
        if rec is not None and verify(key, rec.hash):
            self.verified[d] = rec
            return rec
        self.rejected[d] = None
        if len(self.rejected) > 10_000:
            self.rejected.popitem(last=False)
        return None

    def is_admin(self, key: str) -> bool:
        return self.admin_hash is not None and verify(key, self.admin_hash)
