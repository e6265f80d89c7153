"""The gateway's /v1/models: each model's card as its replicas describe it (vLLM's shape: root,
max_model_len), with the fleet's revision (and traffic split) and the model's kind."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

CARD_TTL_S = 10.0  # a replica's card is re-read at most this often
FETCH_TIMEOUT_S = 2.0


class ModelCards:
    def __init__(self) -> None:
        self._cache: dict[str, tuple[float, dict[str, Any]]] = {}
        self.created = int(time.time())

    async def cards(self, models: dict[str, Any], session: aiohttp.ClientSession | None) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(self._card(rt, session) for rt in models.values())))

    async def _card(self, rt: Any, session: aiohttp.ClientSession | None) -> dict[str, Any]:
        cfg = rt.cfg
        stable = cfg.resolved().get(rt.stable) if cfg.revisions else None  # a rollout may have moved it
        card: dict[str, Any] = {"id": rt.name, "object": "model", "created": self.created, "owned_by": "argosy",
                                "root": (stable.checkpoint if stable else cfg.checkpoint) or rt.name, "parent": None,
                                "max_model_len": None, "revision": rt.stable, "kind": cfg.kind}
        if len(rt.weights) > 1:
            card["traffic"] = [{"revision": rev, "weight": w} for rev, w in rt.weights]
        served = await self._replica_card(rt, session)
        for key in ("max_model_len", "kind"):
            if served.get(key) is not None:
                card[key] = served[key]
        return card

    async def _replica_card(self, rt: Any, session: aiohttp.ClientSession | None) -> dict[str, Any]:
        now = time.monotonic()
        cached = self._cache.get(rt.name)
        if cached is not None and now - cached[0] < CARD_TTL_S:
            return cached[1]
        card: dict[str, Any] = {}
        urls = [u.url for u in rt.upstreams() if u.state == "closed"] or [u.url for u in rt.upstreams()]
        for url in urls[:2] if session is not None else []:
            try:
                async with session.get(url + "/v1/models", timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)) as r:
                    data = (await r.json(content_type=None)).get("data") or []
            except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError):
                continue
            card = next((c for c in data if isinstance(c, dict) and c.get("id") == rt.name), data[0] if data else {})
            break
        if card:
            self._cache[rt.name] = (now, card)
        return card
