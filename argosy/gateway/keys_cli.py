"""`argosy keys add|list|revoke|rotate`: against a running gateway through its admin API (at once; on every
gateway sharing its Redis), or `--offline` on the fleet file (then the gateway needs a restart).

The gateway is --url, else the one whose local admin credential (local_admin.py) this user holds; the
admin key is --admin-key, $ARGOSY_ADMIN_KEY, or that credential. With --config too, a change made online
is also written to the fleet file, so it survives a restart of a gateway without Redis.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import sys
import time
from pathlib import Path

import httpx
import yaml

from argosy.config import FleetConfigError, load_fleet, parse_fleet
from argosy.config_yaml import YamlFileError, read_yaml
from argosy.gateway import local_admin
from argosy.gateway.keys import check_pepper, new_key
from argosy.gateway.pepper import fleet_pepper

PROG = "argosy keys"


def add_keys_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="keys_command", required=True)
    add = sub.add_parser("add", help="create a key: printed once, stored only as a hash")
    add.add_argument("name")
    add.add_argument("--models", help="comma-separated models the key may use (default: all)")
    add.add_argument("--rpm", type=int, help="requests per minute")
    add.add_argument("--tpm", type=int, help="tokens per minute")
    add.add_argument("--priority", choices=["interactive", "batch"], default="interactive")
    add.add_argument("--budget", type=float, metavar="USD", help="spend (price book rates) past which it gets 429")
    add.add_argument("--expires", metavar="WHEN", help="30d, 12h, 90m, or an ISO date/time (UTC): then 401")
    add.add_argument("--admin", action="store_true", help="make this the admin key (admin_key_hash; needs --config)")
    sub.add_parser("list", help="keys, limits, budget, expiry and usage (requests, tokens, spend)")
    for verb, text in (("revoke", "revoke a key: it gets 401 at once"),
                       ("rotate", "a new secret for a key (same limits and usage); the old one stops at once")):
        sub.add_parser(verb, help=text).add_argument("name")
    for p in sub.choices.values():
        p.add_argument("--url", help="the gateway (default: the one `argosy serve` started on this machine)")
        p.add_argument("--admin-key", default=os.environ.get("ARGOSY_ADMIN_KEY"),
                       help="admin key (default: $ARGOSY_ADMIN_KEY, or the local admin credential)")
        p.add_argument("--config", help="fleet file: written too (online), or the only target (--offline)")
        p.add_argument("--offline", action="store_true", help="change the fleet file only (restart to apply)")


def run_keys(args: argparse.Namespace) -> int:
    try:
        if args.offline or getattr(args, "admin", False):
            if not args.config:
                raise KeysError("--offline and --admin change a fleet file: give --config FILE")
            return _offline(args)
        return _online(args)
    except KeysError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2


class KeysError(Exception):
    pass


def parse_expiry(text: str, now: float | None = None) -> float:
    m = re.fullmatch(r"(\d+)([dhm])", text.strip())
    if m:
        return (now or time.time()) + int(m.group(1)) * {"d": 86400, "h": 3600, "m": 60}[m.group(2)]
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise KeysError(f"--expires {text!r}: give 30d, 12h, 90m or an ISO date such as 2027-01-31") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


def _gateway(args) -> tuple[str, dict[str, str]]:
    cred = local_admin.read()
    url = args.url or (cred or {}).get("url")
    if not url:
        raise KeysError("no running gateway found: start one with `argosy serve`, pass --url URL, "
                        "or change a fleet file with --config FILE --offline")
    key = args.admin_key or local_admin.key_for(url)  # a gateway on 0.0.0.0 reached as 127.0.0.1 too
    return url.rstrip("/"), ({"authorization": f"Bearer {key}"} if key else {})


def _call(method: str, url: str, headers: dict, path: str, body: dict | None = None) -> dict:
    try:
        r = httpx.request(method, url + path, headers=headers, json=body, timeout=15)
    except httpx.HTTPError as e:
        raise ConnectionError(f"cannot reach the gateway at {url} ({type(e).__name__})") from None
    if r.status_code in (401, 403):
        raise KeysError(f"{url} refused the admin call ({r.status_code}): pass --admin-key KEY (or set "
                        "ARGOSY_ADMIN_KEY), or run this on the machine where `argosy serve` runs")
    if r.status_code >= 400:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:300]
        raise KeysError(f"{url}: {message}")
    return r.json()


def _online(args) -> int:
    url, headers = _gateway(args)
    verb = args.keys_command
    try:
        if verb == "list":
            print(render(_call("GET", url, headers, "/admin/keys")["keys"]))
            return 0
        if verb == "add":
            body = {"name": args.name, "priority": args.priority, "rpm": args.rpm, "tpm": args.tpm,
                    "budget_usd": args.budget, "models": _models(args.models),
                    "expires_at": parse_expiry(args.expires) if args.expires else None}
            out = _call("POST", url, headers, "/admin/keys", {k: v for k, v in body.items() if v is not None})
            if body["expires_at"] is not None and body["expires_at"] <= time.time():
                print(f"{PROG}: warning: --expires {args.expires} is not in the future: the key is refused (401 "
                      "key_expired) from the start", file=sys.stderr)
        elif verb == "rotate":
            out = _call("POST", url, headers, f"/admin/keys/{args.name}/rotate")
        else:
            out = _call("DELETE", url, headers, f"/admin/keys/{args.name}")
    except ConnectionError as e:
        if not args.config:
            raise KeysError(f"{e}: start it, pass --url URL, or use --config FILE --offline") from None
        print(f"{PROG}: {e}; changing {args.config} only", file=sys.stderr)
        return _offline(args)
    where = "every gateway on its Redis" if out.get("shared") else "this gateway (no Redis: until it restarts)"
    if args.config:
        _write_file(args, out.get("hash"))
        where += f", and {args.config}"
    if "key" in out:
        print(out["key"])
        print(f"(shown once; key {args.name!r} works now on {where})", file=sys.stderr)
    else:
        print(f"{PROG}: key {args.name!r} revoked on {where}", file=sys.stderr)
        if out.get("in_fleet_file") and not out.get("shared") and not args.config:  # a leaked key must stay out
            print(f"{PROG}: warning: {args.name!r} is in the gateway's fleet file and comes back when the gateway "
                  f"restarts; remove it there too: argosy keys revoke {args.name} --config FLEET_FILE", file=sys.stderr)
        if out.get("keys_left") == 0:
            print(f"{PROG}: no keys left: every request gets 401 until a key is added", file=sys.stderr)
    return 0


def _models(text: str | None) -> list[str] | None:
    return [m.strip() for m in text.split(",") if m.strip()] if text else None


def _load(path: Path) -> dict:
    try:
        return (read_yaml(path) if path.exists() else None) or {}
    except YamlFileError as e:
        raise KeysError(str(e)) from None


def _write_file(args, key_hash: str | None) -> dict:
    """Applies the command to the fleet file (validated before it is written); returns the file's data."""
    path = Path(args.config)
    data = _load(path)
    keys = data.get("keys") or []
    verb = args.keys_command
    if verb == "add" and getattr(args, "admin", False):
        data["admin_key_hash"] = key_hash
    elif verb == "add":
        if any(k.get("name") == args.name for k in keys):
            raise KeysError(f"a key named {args.name!r} already exists in {path}")
        entry = {"name": args.name, "hash": key_hash, "priority": args.priority}
        extra = {"models": _models(args.models), "rpm": args.rpm, "tpm": args.tpm, "budget_usd": args.budget,
                 "expires_at": dt.datetime.fromtimestamp(parse_expiry(args.expires), dt.UTC).isoformat()
                 if args.expires else None}
        data["keys"] = [*keys, {**entry, **{k: v for k, v in extra.items() if v is not None}}]
    elif verb in ("revoke", "rotate"):
        if not any(k.get("name") == args.name for k in keys):
            raise KeysError(f"no key named {args.name!r} in {path}")
        if verb == "revoke":
            data["keys"] = [k for k in keys if k.get("name") != args.name]
        else:
            data["keys"] = [{**k, "hash": key_hash} if k.get("name") == args.name else k for k in keys]
    try:
        parse_fleet(data, str(path))
    except FleetConfigError as e:
        raise KeysError(str(e)) from None
    path.write_text(yaml.safe_dump(data, sort_keys=False))  # note: rewriting drops YAML comments
    return data


def _offline(args) -> int:
    verb, path = args.keys_command, Path(args.config)
    if verb == "list":
        keys = _load(path).get("keys") or []
        print(render([{**k, "source": "fleet", "usage": None} for k in keys]))
        print(f"(from {path}; usage needs a running gateway: drop --offline)", file=sys.stderr)
        return 0
    key = key_hash = None
    if verb in ("add", "rotate"):
        pepper = fleet_pepper(path)
        why = check_pepper(load_fleet(path), pepper, "the pepper found") if path.exists() else None
        if why:  # a second pepper would leave the file's other keys unverifiable
            raise KeysError(why)
        key, key_hash = new_key(pepper)
    _write_file(args, key_hash)
    if key is not None:
        print(key)
    done = {"add": "added (shown once)", "rotate": "rotated (shown once)", "revoke": "revoked"}[verb]
    print(f"{PROG}: key {args.name!r} {done} in {path}; restart the gateway (argosy serve / argosy gateway) "
          "to apply it", file=sys.stderr)
    return 0


def render(keys: list[dict]) -> str:
    if not keys:
        return "no keys (the gateway accepts requests without one, on loopback only)"
    rows = [("name", "source", "models", "rpm", "tpm", "budget $", "expires (UTC)", "requests", "in tokens",
             "out tokens", "spend $")]
    for k in keys:
        u = k.get("usage") or {}
        expires = k.get("expires_at")
        if isinstance(expires, int | float):
            expires = dt.datetime.fromtimestamp(expires, dt.UTC).strftime("%Y-%m-%d %H:%M")
        rows.append((k["name"], k.get("source") or "fleet", ",".join(k.get("models") or []) or "all",
                     str(k.get("rpm") or "-"), str(k.get("tpm") or "-"),
                     f"{k['budget_usd']:g}" if k.get("budget_usd") else "-", str(expires or "-"),
                     *(str(u[f]) if u else "-" for f in ("requests", "input_tokens", "output_tokens")),
                     f"{u['spend_usd']:.6f}" if u else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
