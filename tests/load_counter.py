"""The fault matrix's counting client: steady streamed and non-streamed load, every request classified.

  answered  200 and the whole answer: a JSON completion, or a stream with a finish_reason and [DONE]
  refused   an OpenAI-format error (`{"error": {...}}`) with a 4xx/5xx status, carrying Retry-After where
            waiting helps (429, 503, 504); a connection refused (nothing accepted it) counts here too
  cut       a stream that had started and ended with an SSE error event in the OpenAI format, then [DONE]
  lost      anything else: no answer within the timeout, a connection dropped without an answer, a stream
            that stopped without an error event, a 500, an error without Retry-After or not in OpenAI form

Recovery: seconds from the fault (or from its end, for a fault that is lifted) until the first answer of
the final run of answered requests; 0 when nothing after the fault failed.
"""

from __future__ import annotations

import asyncio
import errno
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

RETRY_AFTER_STATUSES = {429, 503, 504}


@dataclass
class Outcome:
    kind: str  # answered, refused, cut, lost
    t0: float
    t1: float
    detail: str = ""


@dataclass
class Tally:
    scenario: str
    outcomes: list[Outcome] = field(default_factory=list)
    fault_at: float | None = None
    healed_at: float | None = None
    notes: str = ""
    survivors_up: bool = True  # the gateways and healthy replicas were still running at the end

    def count(self, kind: str) -> int:
        return sum(1 for o in self.outcomes if o.kind == kind)

    @property
    def lost(self) -> int:
        return self.count("lost")

    def recovery_s(self) -> float | None:
        """Seconds from the fault (or from its end, when it is lifted) until the first answer of the final run
        of answered requests (by completion time); 0 when nothing failed after the fault; None when the load
        never got back to all answered."""
        if self.fault_at is None:
            return 0.0
        done = sorted(self.outcomes, key=lambda o: o.t1)
        if not any(o.kind != "answered" and o.t1 >= self.fault_at for o in done):
            return 0.0
        streak_at = None
        for o in reversed(done):
            if o.kind != "answered":
                break
            streak_at = o.t1
        if streak_at is None:
            return None
        return max(0.0, streak_at - (self.healed_at or self.fault_at))

    def details(self) -> Counter:
        return Counter(f"{o.kind}: {o.detail}" for o in self.outcomes if o.kind != "answered")

    def row(self) -> str:
        rec = self.recovery_s()
        rec_s = "never" if rec is None else f"{rec:.1f}"
        return (f"| {self.scenario} | {len(self.outcomes)} | {self.count('answered')} | {self.count('refused')} | "
                f"{self.count('cut')} | {self.lost} | {rec_s} |")


HEADER = ("| scenario | requests | answered | refused | cut off (error event) | lost | recovery s |\n"
          "|---|---|---|---|---|---|---|")


def _refusal(status: int, headers, body: bytes) -> tuple[str, str]:
    try:
        err = json.loads(body)["error"]
        ok_shape = isinstance(err, dict) and isinstance(err.get("message"), str) and "type" in err
    except (ValueError, KeyError, TypeError):
        return "lost", f"{status} without an OpenAI error body"
    if not ok_shape:
        return "lost", f"{status} error body not in OpenAI form"
    if status >= 500 and status not in (502, 503, 504):
        return "lost", f"{status} {err.get('code')}"
    if status in RETRY_AFTER_STATUSES and "retry-after" not in headers:
        return "lost", f"{status} {err.get('code')} without Retry-After"
    return "refused", f"{status} {err.get('code')}"


def _stream_outcome(text: str) -> tuple[str, str]:
    events = [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]
    done = bool(events) and events[-1] == "[DONE]"
    errors, finished = [], False
    for e in events:
        if e == "[DONE]":
            continue
        try:
            obj = json.loads(e)
        except ValueError:
            return "lost", "an event that is not JSON"
        if "error" in obj:
            errors.append(obj["error"])
        elif any(c.get("finish_reason") for c in obj.get("choices") or []):
            finished = True
    if errors:
        good = done and events[-2:-1] and "error" in json.loads(events[-2]) and isinstance(errors[-1], dict) \
            and "message" in errors[-1]
        return ("cut", str(errors[-1].get("code"))) if good else ("lost", "error event not followed by [DONE]")
    if finished and done:
        return "answered", ""
    return "lost", "stream ended without an error event" if not done else "stream without a finish_reason"


async def one_request(s: aiohttp.ClientSession, url: str, body: dict, headers: dict, timeout: float) -> Outcome:
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            async with s.post(url + "/v1/completions", json=body, headers=headers) as r:
                data = await r.read()
                if r.status != 200:
                    kind, detail = _refusal(r.status, r.headers, data)
                elif body.get("stream"):
                    kind, detail = _stream_outcome(data.decode(errors="replace"))
                else:
                    try:
                        ok = bool(json.loads(data)["choices"])
                        kind, detail = ("answered", "") if ok else ("lost", "no choices")
                    except (ValueError, KeyError, TypeError):
                        kind, detail = "lost", "200 with a body that is not a completion"
    except TimeoutError:
        kind, detail = "lost", f"no answer within {timeout:g} s"
    except aiohttp.ClientConnectorError as e:
        refused = getattr(e.os_error, "errno", None) == errno.ECONNREFUSED
        kind, detail = ("refused", "connection refused") if refused else ("lost", f"connect: {e}")
    except (aiohttp.ClientError, OSError) as e:
        kind, detail = "lost", type(e).__name__
    return Outcome(kind, t0, time.monotonic(), detail)


class CountingClient:
    """`workers` loops, alternating streamed and non-streamed requests, until stop(); `pause_s` between a
    worker's requests keeps the load steady rather than saturating."""

    def __init__(self, url: str, model: str, tally: Tally, workers: int = 4, max_tokens: int = 8,
                 prompt: str = "Once upon a time", timeout: float = 30.0, pause_s: float = 0.05,
                 api_key: str | None = None, extra: dict | None = None):
        self.url, self.model, self.tally = url, model, tally
        self.workers, self.max_tokens, self.prompt = workers, max_tokens, prompt
        self.timeout, self.pause_s = timeout, pause_s
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.extra = extra or {}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.in_flight_streams = 0

    async def _worker(self, i: int) -> None:
        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=conn) as s:
            n = 0
            while not self._stop.is_set():
                stream = (i + n) % 2 == 0
                n += 1
                body = {"model": self.model, "prompt": self.prompt, "max_tokens": self.max_tokens,
                        "stream": stream, **self.extra}
                self.in_flight_streams += stream
                try:
                    self.tally.outcomes.append(await one_request(s, self.url, body, self.headers, self.timeout))
                finally:
                    self.in_flight_streams -= stream
                await asyncio.sleep(self.pause_s)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(i)) for i in range(self.workers)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def run_for(self, seconds: float) -> None:
        self.start()
        await asyncio.sleep(seconds)
        await self.stop()
