"""Shadow traffic: a sampled share of a model's requests also goes to a candidate (a rollout's canary or
blue-green preview, or the fleet file's `shadow` upstreams), and the two answers are compared.

The user's answer always comes from the revision that served it; a shadow is a background task that
nothing of the user's request waits for, outside admission and the key's limits, dropped (never queued)
beyond `max_in_flight`. The shadow request streams, with logprobs asked for, so its TTFT and token gaps
are measured and its tokens known. When the user's answer is complete the pair is reduced to numbers
(shadow_pairs.PairRecord) and the text is dropped; an optional judge (any OpenAI-compatible model) scores
a sample of pairs. A blue-green preview's shadow latencies also feed the rollout's analysis.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from argosy.gateway.bodies import prompt_of
from argosy.gateway.revision_stats import SHADOW, RequestSample
from argosy.gateway.router import Router, RouteRequest
from argosy.gateway.shadow_pairs import PairRecord, PairStore, compare, is_greedy, parse_output

if TYPE_CHECKING:
    from argosy.config_rollout import ShadowEvalConfig
    from argosy.gateway.traffic import ModelRuntime

log = logging.getLogger("argosy.gateway")
JUDGE_PROMPT = ("Two answers to the same request follow. Reply with one integer from 0 to 10: how well answer B "
                "matches answer A in meaning and quality (10: equivalent). Reply with the number only.")


@dataclass
class ShadowTarget:
    revision: str
    router: Router
    sample: float
    max_in_flight: int
    judge: ShadowEvalConfig | None = None
    feeds_analysis: bool = False  # its latencies go into the model's RevisionStats (blue-green preview)


def shadow_body(path: str, fields: dict[str, Any]) -> bytes:
    """The request as the candidate gets it: streamed, one choice, with the chosen tokens' logprobs."""
    b = {**fields, "stream": True, "stream_options": {"include_usage": True}, "n": 1}
    if path == "/v1/chat/completions":
        b["logprobs"] = True
    elif not fields.get("echo") and b.get("logprobs") is None:
        b["logprobs"] = 0
    return json.dumps(b).encode()


class Shadower:
    def __init__(self, session_getter, metrics):
        self.session, self.m = session_getter, metrics
        self.in_flight: dict[str, int] = {}
        self.tasks: set[asyncio.Task] = set()
        self.pairs = PairStore()

    def maybe_start(self, rt: ModelRuntime, path: str, fields: dict, rreq: RouteRequest,
                    served: str) -> asyncio.Future | None:
        """Start a shadow for a sampled request served by `served`; returns the future the user's output
        goes into (the comparison waits for it)."""
        target = rt.shadow_target(served)
        if target is None or path == "/v1/embeddings" or random.random() >= target.sample:
            return None
        if self.in_flight.get(rt.name, 0) >= target.max_in_flight:
            self.m.shadow.labels(rt.name, "dropped").inc()
            return None
        user_out: asyncio.Future = asyncio.get_running_loop().create_future()
        t = asyncio.get_running_loop().create_task(self._run(rt, target, path, fields, rreq, user_out))
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)
        return user_out

    async def _run(self, rt: ModelRuntime, target: ShadowTarget, path: str, fields: dict, rreq: RouteRequest,
                   user_out: asyncio.Future) -> None:
        self.in_flight[rt.name] = self.in_flight.get(rt.name, 0) + 1
        outcome = "error"
        try:
            u = target.router.choose(rreq)
            if u is None:
                outcome = "no_upstream"
                return
            chunks, status, ttft, gaps, t0 = [], 0, None, [], time.monotonic()
            async with self.session().post(u.url + path, data=shadow_body(path, fields), timeout=aiohttp.ClientTimeout(
                    total=300), headers={"content-type": "application/json"}) as r:
                status, last = r.status, None
                async for chunk in r.content.iter_any():
                    now = time.monotonic()
                    if last is None:
                        ttft = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
                    chunks.append(chunk)
            e2e = time.monotonic() - t0
            self.m.shadow_latency.labels(rt.name).observe(e2e)
            cand = parse_output(chunks, True) if status == 200 else None
            if target.feeds_analysis and rt.recording and status not in range(400, 500):
                rt.stats.add(RequestSample(time.monotonic(), target.revision, SHADOW, cand is None, e2e, ttft, gaps,
                                           (cand.n_tokens or 0) if cand else 0))
            if cand is None:
                return
            user_chunks, user_stream = await asyncio.wait_for(user_out, 600)
            user = parse_output(user_chunks, user_stream)
            if user is None:
                return
            rec = compare(user, cand, target.revision, is_greedy(fields), rreq.prompt_tokens, time.monotonic())
            self.pairs.add(rt.name, rec)
            outcome = "agree" if rec.identical else "disagree"
            j = target.judge
            if j is not None and j.judge_url and random.random() < j.judge_sample:
                await self._judge(j, prompt_of(path, fields)[0], user.text, cand.text, rec)
        except Exception as e:  # a shadow never affects anything but its own metrics
            log.info("shadow request for %s failed: %s", rt.name, type(e).__name__)
        finally:
            self.in_flight[rt.name] -= 1
            self.m.shadow.labels(rt.name, outcome).inc()
            if not user_out.done():
                user_out.cancel()

    async def _judge(self, j: ShadowEvalConfig, prompt: str, a: str, b: str, rec: PairRecord) -> None:
        """Ask the judge for a 0..10 score; the texts go to the judge only, never to a log or a store."""
        headers = {"content-type": "application/json"}
        if j.judge_api_key_env and os.environ.get(j.judge_api_key_env):
            headers["authorization"] = f"Bearer {os.environ[j.judge_api_key_env]}"
        body = {"model": j.judge_model, "temperature": 0, "max_tokens": 8, "messages": [
            {"role": "system", "content": JUDGE_PROMPT},
            {"role": "user", "content": f"Request:\n{prompt}\n\nAnswer A:\n{a}\n\nAnswer B:\n{b}"}]}
        async with self.session().post(j.judge_url.rstrip("/") + "/chat/completions", data=json.dumps(body),
                                       headers=headers, timeout=aiohttp.ClientTimeout(total=60)) as r:
            if r.status != 200:
                return
            reply = (await r.json())["choices"][0]["message"]["content"] or ""
        m = re.search(r"\d+(\.\d+)?", reply)
        if m is not None:
            rec.judge = min(max(float(m.group()) / 10, 0.0), 1.0)

    async def stop(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
