"""One streaming request to an OpenAI-compatible server, timed per chunk.

A chunk "carries tokens" when its first choice has non-empty `text` (completions) or
`delta.content` / `delta.reasoning_content` (chat). Role-only or finish-only chunks do not: a server
that sends the assistant role at once would otherwise show a TTFT of ~0.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from argosy.bench.record import RequestRecord


@dataclass
class Endpoint:
    base_url: str  # http://host:port (a trailing /v1 is fine)
    model: str
    kind: str = "completions"  # or "chat"
    api_key: str | None = None
    ignore_eos: bool = True  # vLLM's extra field: the output runs to max_tokens
    temperature: float = 0.0
    timeout_s: float = 600.0
    extra_body: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        base = self.base_url.rstrip("/")
        base = base[:-3] if base.endswith("/v1") else base
        return f"{base}/v1/{'chat/completions' if self.kind == 'chat' else 'completions'}"

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def body(self, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
        """Chat sends the messages; completions sends their contents joined, so a session's history
        and a shared system prompt form one growing prompt."""
        b: dict[str, Any] = {"model": self.model, "stream": True, "stream_options": {"include_usage": True},
                             "temperature": self.temperature}
        if self.kind == "chat":
            b["messages"] = messages
            b["max_completion_tokens"] = max_tokens
        else:
            b["prompt"] = "\n\n".join(m["content"] for m in messages)
            b["max_tokens"] = max_tokens
        if self.ignore_eos:
            b["ignore_eos"] = True
        b.update(self.extra_body)
        return b


def _token_text(data: dict[str, Any]) -> str:
    choices = data.get("choices")
    if not choices:
        return ""
    c = choices[0]
    if "text" in c:
        return c.get("text") or ""
    delta = c.get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


def _on_line(raw: bytes, now: float, rec: RequestRecord, pieces: list[str]) -> bool:
    """One SSE line into `rec`; False when the stream reports an error."""
    line = raw.strip()
    if not line.startswith(b"data:"):
        return True  # blank lines, comments, event: lines
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return True
    data = json.loads(payload)
    if "error" in data and not data.get("choices"):
        err = data["error"]
        code = err.get("code") if isinstance(err, dict) else None
        rec.error_kind, rec.error = "stream_error", f"error in stream ({code or 'no code'})"
        return False
    if text := _token_text(data):
        rec.chunk_times_s.append(now)
        pieces.append(text)
    if usage := data.get("usage"):
        rec.prompt_tokens = usage.get("prompt_tokens")
        rec.output_tokens = usage.get("completion_tokens")
    return True


def error_code(body: bytes) -> str:
    """`: model_not_found (param model)` from an OpenAI error body; "" from anything else."""
    try:
        err = json.loads(body)["error"]
        code, param = err.get("code"), err.get("param")
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""
    if not isinstance(code, str):
        return ""
    return f": {code[:80]}" + (f" (param {param[:80]})" if isinstance(param, str) else "")


async def send(session: aiohttp.ClientSession, ep: Endpoint, body: dict[str, Any], rec: RequestRecord,
               run_start: float) -> str:
    """POST `body`, stream the answer into `rec` (times, usage, error) and return the generated text
    (kept in memory only, for a session's history)."""
    pieces: list[str] = []
    st = time.perf_counter()
    rec.sent_s = st - run_start
    try:
        async with session.post(ep.url, json=body, headers=ep.headers(),
                                timeout=aiohttp.ClientTimeout(total=ep.timeout_s)) as resp:
            if resp.status != 200:
                # Status, reason and the error's code and param, never its message: a message may quote the prompt.
                rec.error_kind = f"http_{resp.status}"
                rec.error = f"HTTP {resp.status} {resp.reason or ''}".strip() + error_code(await resp.read())
                return ""
            # Whole reads, split here: one await per TCP read instead of one per SSE line, and every
            # event in a read gets the read's arrival time.
            tail = b""
            async for data in resp.content.iter_any():
                now = time.perf_counter() - st
                lines = (tail + data).split(b"\n")
                tail = lines.pop()
                for line in lines:
                    if not _on_line(line, now, rec, pieces):
                        return ""
    except TimeoutError:
        rec.error_kind, rec.error = "timeout", f"no complete answer within {ep.timeout_s:g} s"
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as e:
        rec.error_kind, rec.error = "connection", e.__class__.__name__
    except aiohttp.ClientError as e:
        rec.error_kind, rec.error = "client_error", e.__class__.__name__
    except (ValueError, AttributeError) as e:  # not JSON, or not shaped like a chunk
        rec.error_kind, rec.error = "bad_response", e.__class__.__name__
    finally:
        rec.finished_s = time.perf_counter() - run_start
    if rec.error_kind is None:
        if rec.chunk_times_s:
            rec.ok = True
            rec.ttft_s, rec.e2e_s = rec.chunk_times_s[0], rec.chunk_times_s[-1]
        else:
            rec.error_kind, rec.error = "no_tokens", "the stream ended without a token"
    return "".join(pieces)


def new_session(max_connections: int) -> aiohttp.ClientSession:
    """One session, one pool for the whole run. limit=0 means unbounded: the pool must never queue a
    request the schedule says is due (that would show up as server latency). A pooled connection idle for
    4 s is closed, not reused: uvicorn (vLLM's server) and llama-server close theirs at 5 s, and a request
    sent on a connection the server is closing fails (ServerDisconnectedError) though the server never read
    it, which would count against the server under test."""
    conn = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, ttl_dns_cache=300,
                                keepalive_timeout=4)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None))


async def cancel_all(tasks: set[asyncio.Task]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
