"""API keys: long random secrets, stored only as keyed SHA-256 digests, compared in constant time.

A key reads `sk-argosy-<id>-<secret>` (192 random bits of secret); its stored hash is
`hmac-sha256:<id>:<pepper id>:<digest>`, the digest being HMAC-SHA256(pepper, key) with the gateway's
pepper (pepper.py). A slow password hash buys nothing for a secret this long (GitHub and LiteLLM store
their tokens the same way) and would let a flood of wrong secrets spend the gateway's CPU: a check
here costs about a microsecond. The id (not secret) picks the one record to check.

Hashes from before (`scrypt:<id>:<n>:<r>:<p>:<salt>:<digest>`) still verify, so no key breaks: in one
worker thread off the event loop (hashlib's scrypt releases the GIL), at most MAX_PENDING waiting, one
computation per distinct key at a time, and the answer, right or wrong, is cached under the key's
SHA-256 (a dict lookup on a digest leaks nothing about the secret through timing).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import secrets
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from argosy.config import FleetConfig, KeyConfig
from argosy.gateway.errors import unavailable
from argosy.gateway.pepper import PepperError, load_pepper, pepper_id, pepper_path

HMAC_PREFIX = "hmac-sha256"
MAX_PENDING = 64  # legacy scrypt checks waiting for the worker; beyond, 503 auth_busy
MAX_CACHED = 10_000  # legacy scrypt answers remembered (LRU)


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


def split_key(key: str) -> tuple[str, str] | None:
    parts = key.split("-", 3)
    if len(parts) != 4 or parts[0] != "sk" or parts[1] != "argosy":
        return None
    return parts[2], parts[3]


def new_key(pepper: bytes | None = None) -> tuple[str, str]:
    """A fresh key and its stored hash (keyed with `pepper`; by default the one pepper.py finds, or makes)."""
    if pepper is None:
        pepper, _ = load_pepper(pepper_path(None), create=True)
    kid = secrets.token_hex(4)
    key = f"sk-argosy-{kid}-{secrets.token_urlsafe(24)}"
    return key, hash_key(key, pepper)


def hash_key(key: str, pepper: bytes) -> str:
    kid, _ = split_key(key) or ("", "")
    digest = hmac.new(pepper, key.encode(), hashlib.sha256).hexdigest()
    return f"{HMAC_PREFIX}:{kid}:{pepper_id(pepper)}:{digest}"


def hash_id(stored: str) -> str | None:
    """The key id a stored hash is for, or None when it is not an Argosy key hash."""
    parts = stored.split(":")
    if len(parts) == 4 and parts[0] == HMAC_PREFIX or len(parts) == 7 and parts[0] == "scrypt":
        return parts[1]
    return None


def hash_pepper_id(stored: str) -> str | None:
    parts = stored.split(":")
    return parts[2] if len(parts) == 4 and parts[0] == HMAC_PREFIX else None


def verify(key: str, stored: str, pepper: bytes | None) -> bool:
    """Whether `key` matches `stored` (either format). Scrypt is slow: KeyStore runs it off the loop."""
    parts = stored.split(":")
    if len(parts) == 4 and parts[0] == HMAC_PREFIX:
        if pepper is None:
            return False
        got = hmac.new(pepper, key.encode(), hashlib.sha256).digest()
        return hmac.compare_digest(got, bytes.fromhex(parts[3]))
    if len(parts) == 7 and parts[0] == "scrypt":
        n, r, p = int(parts[2]), int(parts[3]), int(parts[4])
        dk = hashlib.scrypt(key.encode(), salt=bytes.fromhex(parts[5]), n=n, r=r, p=p, dklen=32, maxmem=2**27)
        return hmac.compare_digest(dk, bytes.fromhex(parts[6]))
    return False


def is_legacy(stored: str) -> bool:
    return stored.startswith("scrypt:")


def check_pepper(fleet: FleetConfig, pepper: bytes | None, where: str) -> str | None:
    """Why the fleet's HMAC hashes cannot verify with this pepper (one line), or None when they can."""
    hashes = [(k.name, k.hash) for k in fleet.keys] + ([("admin", fleet.admin_key_hash)]
                                                       if fleet.admin_key_hash else [])
    for name, h in hashes:
        if hash_id(h) is None:
            return f"key {name!r}: its hash is not an Argosy key hash (argosy keys add ... makes one)"
        pid = hash_pepper_id(h)
        if pid is None:
            continue
        if pepper is None:
            return (f"key {name!r} is hashed with key pepper {pid}, and no pepper was found ({where}): "
                    f"set ARGOSY_KEY_PEPPER or gateway.key_pepper_file to the one `argosy keys` created")
        if pepper_id(pepper) != pid:
            return (f"key {name!r} is hashed with key pepper {pid}, but this gateway's pepper ({where}) is "
                    f"{pepper_id(pepper)}: use the pepper the key was made with")
    return None


class KeyStore:
    def __init__(self, keys: list[KeyRecord], admin_hash: str | None = None, pepper: bytes | None = None,
                 pepper_file: str | None = None):
        self.pepper, self.pepper_file = pepper, pepper_file
        self.by_id: dict[str, KeyRecord] = {}
        self.admin_hash = admin_hash
        # Once this gateway has had a key, it never serves without one again: revoking the last key had turned
        # authentication off, on 0.0.0.0 too (where a gateway with no keys refuses to start).
        self.had_keys = False
        for k in keys:
            self.add(k)
        self.verified: dict[bytes, KeyRecord] = {}  # sha256(key) -> record: a request's check after the first
        self.admin_digest: bytes | None = None
        self.legacy: OrderedDict[bytes, bool] = OrderedDict()  # sha256(key + stored) -> scrypt's answer
        self.pending: dict[bytes, asyncio.Future] = {}
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def from_fleet(cls, fleet: FleetConfig) -> KeyStore:
        """The fleet's keys with the pepper (read now when any hash needs it; else when a key is made)."""
        path = str(pepper_path(fleet.gateway.key_pepper_file))
        pepper = None
        hashes = [k.hash for k in fleet.keys] + [fleet.admin_key_hash or ""]
        if any(hash_pepper_id(h) for h in hashes):
            pepper, path = load_pepper(pepper_path(fleet.gateway.key_pepper_file))
            why = check_pepper(fleet, pepper, path)
            if why:
                raise PepperError(why)
        return cls([KeyRecord.from_config(k) for k in fleet.keys], fleet.admin_key_hash, pepper, path)

    def add(self, k: KeyRecord) -> None:
        kid = hash_id(k.hash)
        if kid is None:
            raise ValueError(f"key {k.name!r}: its hash is not an argosy key hash (keys are made with "
                             "`argosy keys add NAME --config FLEET_FILE`, which writes the hash)")
        self.by_id[kid] = k
        self.had_keys = True

    def mint(self) -> tuple[str, str]:
        """A new key for this gateway (POST /admin/keys): creates the pepper file if there is none yet."""
        if self.pepper is None:
            self.pepper, self.pepper_file = load_pepper(pepper_path(self.pepper_file), create=True)
        return new_key(self.pepper)

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
        self.had_keys = self.had_keys or bool(by_id)
        live = {id(k) for k in by_id.values()}
        self.verified = {d: r for d, r in self.verified.items() if id(r) in live}

    def named(self, name: str) -> KeyRecord | None:
        return next((k for k in self.by_id.values() if k.name == name), None)

    @property
    def keyless(self) -> bool:
        """No key now and none ever (then loopback only, and no key is asked for); with every key revoked, every
        request is a 401 until one is added."""
        return not self.by_id and not self.had_keys

    def cached(self, key: str) -> KeyRecord | None:
        """The record of a key verified before (one dict lookup), else None."""
        return self.verified.get(hashlib.sha256(key.encode()).digest())

    async def lookup(self, key: str) -> KeyRecord | None:
        d = hashlib.sha256(key.encode()).digest()
        rec = self.verified.get(d)
        if rec is not None:
            return rec
        split = split_key(key)
        rec = self.by_id.get(split[0]) if split else None
        if rec is None or not await self._verify(key, rec.hash):
            return None
        if self.by_id.get(split[0]) is rec:  # not revoked meanwhile
            self.verified[d] = rec
        return rec

    def admin_cached(self, key: str) -> bool:
        d = hashlib.sha256(key.encode()).digest()
        return self.admin_digest is not None and hmac.compare_digest(d, self.admin_digest)

    async def is_admin(self, key: str) -> bool:
        if self.admin_hash is None:
            return False
        if self.admin_cached(key):
            return True
        if await self._verify(key, self.admin_hash):
            self.admin_digest = hashlib.sha256(key.encode()).digest()
            return True
        return False

    async def _verify(self, key: str, stored: str) -> bool:
        if not is_legacy(stored):
            return verify(key, stored, self.pepper)  # HMAC: a microsecond, on the loop
        d = hashlib.sha256(key.encode() + b"\0" + stored.encode()).digest()
        known = self.legacy.get(d)
        if known is not None:
            self.legacy.move_to_end(d)
            return known
        fut = self.pending.get(d)
        if fut is None:  # the first asker computes; the others with the same key wait for its answer
            if len(self.pending) >= MAX_PENDING:
                raise unavailable("too many API keys are being verified; retry later", "auth_busy", 1.0)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="argosy-scrypt")
            fut = asyncio.get_running_loop().run_in_executor(self._pool, verify, key, stored, None)
            self.pending[d] = fut
            try:
                ok = await asyncio.shield(fut)
            finally:
                self.pending.pop(d, None)
            self.legacy[d] = ok
            if len(self.legacy) > MAX_CACHED:
                self.legacy.popitem(last=False)
            return ok
        return await asyncio.shield(fut)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
