"""Input and output checks per model: PII (redact or block), word and regex blocklists, prompt size,
and an external moderation endpoint (POST {"input": text} -> {"flagged": bool} or OpenAI's
{"results": [{"flagged": bool}]}). Output checks run on streams through StreamGuard, which holds
back a small window so a match split across chunks is still caught.
"""

from __future__ import annotations

import re

import aiohttp

from argosy.config_gateway import GuardrailsConfig, GuardrailStep
from argosy.gateway.errors import GatewayError, unavailable

CARD = re.compile(r"(?<!\d)\d(?:[ -]?\d){12,18}(?!\d)")
IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b")
EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
PHONE = re.compile(r"(?<![\w+])\+?\d(?:[ .()-]{0,2}\d){7,14}(?!\w)")


def luhn_ok(s: str) -> bool:
    digits = [int(c) for c in s if c.isdigit()]
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def iban_ok(s: str) -> bool:
    s = s.replace(" ", "")
    r = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in r)) % 97 == 1


PII = [("CREDIT_CARD", CARD, luhn_ok), ("IBAN", IBAN, iban_ok), ("EMAIL", EMAIL, None), ("PHONE", PHONE, None)]


class Blocked(Exception):
    pass


def _pii(text: str, mode: str, final: bool, window: int) -> tuple[str, int]:
    """Redact (or raise Blocked on) PII; returns the text and where a still-growing match begins
    (on a stream, a match ending in the last `window` characters may still grow: everything from its
    start stays held, unredacted, until it has left the window or the stream ends)."""
    hold = len(text)
    if not final:
        for _, pat, check in PII:
            for m in pat.finditer(text):  # the buffer is small: the window plus one chunk
                if m.end() > len(text) - window and (not check or check(m.group())):
                    hold = min(hold, m.start())
    head, tail = text[:hold], text[hold:]
    for label, pat, check in PII:
        def sub(m: re.Match, label=label, check=check) -> str:
            if check and not check(m.group()):
                return m.group()
            if mode == "block":
                raise Blocked(f"{label.lower()} detected")
            return f"[{label}]"
        head = pat.sub(sub, head)
    return head + tail, len(head)


class Guardrails:
    def __init__(self, cfg: GuardrailsConfig, session_getter):
        self.cfg = cfg
        self.session = session_getter  # the gateway's shared aiohttp session (created at startup)
        self.input, self.output = cfg.input, cfg.output
        self.window = cfg.stream_window_chars
        for s in cfg.output:
            for w in s.blocklist or []:
                self.window = max(self.window, len(w))
        self._compiled: dict[int, re.Pattern] = {}

    def _pattern(self, step: GuardrailStep) -> re.Pattern:
        p = self._compiled.get(id(step))
        if p is None:
            if step.blocklist is not None:
                p = re.compile("|".join(rf"(?<!\w){re.escape(w)}(?!\w)" for w in step.blocklist), re.I)
            else:
                p = re.compile("|".join(f"(?:{r})" for r in step.regex or []))
            self._compiled[id(step)] = p
        return p

    def scan(self, steps: list[GuardrailStep], text: str, final: bool = True) -> tuple[str, int]:
        """Synchronous checks over text: returns (possibly redacted text, hold point); raises Blocked."""
        hold = len(text)
        for s in steps:
            if s.pii:
                text, h = _pii(text, s.pii, final, self.window)
                hold = min(hold, h)
            elif s.blocklist or s.regex:
                m = self._pattern(s).search(text)
                if m:
                    raise Blocked("blocked phrase" if s.blocklist else "blocked pattern")
        return text, hold

    async def moderate(self, url: str, text: str) -> None:
        try:
            async with self.session().post(url, json={"input": text}, timeout=aiohttp.ClientTimeout(total=10)) as r:
                r.raise_for_status()
                body = await r.json(content_type=None)
        except Exception:
            # Fail closed: a guardrail that cannot run does not let content through.
            raise unavailable("the moderation service is unavailable", "moderation_unavailable") from None
        flagged = body.get("flagged")
        if flagged is None:
            flagged = any(x.get("flagged") for x in body.get("results", []))
        if flagged:
            raise Blocked("flagged by moderation")

    async def check_input(self, texts: list[str], est_tokens: int) -> list[str]:
        try:
            for s in self.input:
                if s.max_prompt_tokens is not None and est_tokens > s.max_prompt_tokens:
                    raise GatewayError(400, f"the prompt is about {est_tokens} tokens; this model accepts at most "
                                       f"{s.max_prompt_tokens}", "invalid_request_error", "prompt_too_long",
                                       "messages")
                if s.moderation_url:
                    await self.moderate(s.moderation_url, "\n".join(texts))
                elif s.pii or s.blocklist or s.regex:
                    texts = [self.scan([s], t)[0] for t in texts]
        except Blocked as e:
            raise GatewayError(400, f"the request was blocked by a guardrail: {e}", "invalid_request_error",
                               "content_filter") from None
        return texts

    async def check_output(self, text: str) -> str:
        text, _ = self.scan(self.output, text)
        for s in self.output:
            if s.moderation_url:
                await self.moderate(s.moderation_url, text)
        return text

    @property
    def output_moderation(self) -> list[str]:
        return [s.moderation_url for s in self.output if s.moderation_url]


class StreamGuard:
    """Output checks over one streamed choice. feed() returns the text safe to release now;
    the last `window` characters (and any match still growing) stay held until finish()."""

    def __init__(self, g: Guardrails):
        self.g, self.buf, self.all = g, "", [] if g.output_moderation else None

    def feed(self, text: str) -> str:
        buf, hold = self.g.scan(self.g.output, self.buf + text, final=False)
        cut = min(len(buf) - self.g.window, hold)
        if cut <= 0:
            self.buf = buf
            return ""
        out, self.buf = buf[:cut], buf[cut:]
        if self.all is not None:
            self.all.append(out)
        return out

    async def finish(self) -> str:
        out, _ = self.g.scan(self.g.output, self.buf)
        self.buf = ""
        if self.all is not None:
            # Moderation on streams runs once, on the whole output, before the held window is released.
            self.all.append(out)
            for url in self.g.output_moderation:
                await self.g.moderate(url, "".join(self.all))
        return out
