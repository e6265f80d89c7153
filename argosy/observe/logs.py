"""Structured logs: one JSON object per line on stderr, carrying the id and trace id of the request served.

    {"ts": "2025-01-01T12:00:00.123Z", "level": "info", "logger": "argosy.access", "msg": "request",
     "request_id": "8f3c...", "trace_id": "4bf9...", "model": "chat", "status": 200, "latency_ms": 41.2}

Each HTTP request binds its ids in a ContextVar (asyncio gives each request task its own context), so
every line logged while serving it carries them without passing them around. Prompts and outputs are
never logged by these modules; the gateway logs bodies only when `log_content: true` (or a model's debug).

One line per request ("access log", logger `argosy.access`) is off unless `--log-requests`, as in vLLM
(>= 0.10): at high request rates it is the bulk of the output.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import re
import sys
import uuid
from dataclasses import dataclass

FORMATS = ("auto", "json", "text")  # auto: text on a terminal, JSON otherwise (files, pipes, collectors)
LEVELS = ("debug", "info", "warning", "error", "critical")
ACCESS = logging.getLogger("argosy.access")
_VALID_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# Attributes every LogRecord has; anything else on a record came from `extra=` and is a field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


@dataclass(frozen=True, slots=True)
class RequestIds:
    request_id: str
    trace_id: str | None  # 32 hex digits, when the request is traced or came with a W3C traceparent


_current: contextvars.ContextVar[RequestIds | None] = contextvars.ContextVar("argosy_request", default=None)


def bind_request(request_id: str, trace_id: str | None) -> contextvars.Token:
    return _current.set(RequestIds(request_id, trace_id))


def unbind_request(token: contextvars.Token) -> None:
    _current.reset(token)


def current_request() -> RequestIds | None:
    return _current.get()


def request_id_from(header: bytes | None) -> str:
    """The caller's X-Request-Id when it is a sane token (kept so logs join across services), else a new one."""
    if header:
        text = header.decode("latin-1")
        if _VALID_ID.fullmatch(text):
            return text
    return uuid.uuid4().hex


def request_headers(scope) -> tuple[str, bytes | None]:
    """An ASGI request's id (see request_id_from) and its raw W3C traceparent header, if any."""
    rid_header = parent = None
    for k, v in scope["headers"]:
        if k == b"x-request-id":
            rid_header = v
        elif k == b"traceparent":
            parent = v
    return request_id_from(rid_header), parent


def trace_id_from(traceparent: bytes | None) -> str | None:
    """The trace id of a W3C traceparent (`00-<32 hex>-<16 hex>-<2 hex>`), for logs when tracing is off."""
    if traceparent and len(traceparent) >= 55 and traceparent[2:3] == b"-":
        tid = traceparent[3:35].decode("latin-1").lower()
        if tid != "0" * 32 and all(c in "0123456789abcdef" for c in tid):
            return tid
    return None


def _fields(record: logging.LogRecord) -> dict:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = dt.datetime.fromtimestamp(record.created, dt.UTC)
        out: dict = {"ts": ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z",
                     "level": record.levelname.lower(), "logger": record.name}
        msg = record.getMessage()
        event = _json_object(msg)
        if event is not None:  # already structured (the fleet controller logs json.dumps(event)): merge it
            out["msg"] = str(event.get("event", ""))
            out.update(event)
        else:
            out["msg"] = msg
        ids = _current.get()
        if ids is not None:
            out["request_id"] = ids.request_id
            if ids.trace_id:
                out["trace_id"] = ids.trace_id
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = _current.get()
        extra = {"request_id": ids.request_id, "trace_id": ids.trace_id} if ids else {}
        extra.update(_fields(record))
        tail = " ".join(f"{k}={v}" for k, v in extra.items() if v is not None)
        return f"{line} {tail}" if tail else line


def _json_object(msg: str) -> dict | None:
    if not msg.startswith("{"):
        return None
    try:
        obj = json.loads(msg)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def setup_logging(fmt: str = "auto", level: str = "info", log_requests: bool = False) -> None:
    """Root logger -> stderr in `fmt`; replaces earlier handlers (idempotent). Raises ValueError on bad input."""
    if fmt not in FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        raise ValueError(f"--log-level must be debug, info, warning, error or critical, not {level!r}")
    if fmt == "auto":
        fmt = "text" if sys.stderr.isatty() else "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(lvl)
    # The access logger has its own switch; the hot path checks ACCESS.isEnabledFor(INFO) (cached by logging).
    ACCESS.setLevel(logging.INFO if log_requests else logging.WARNING)


def add_logging_arguments(parser, log_level: bool = True) -> None:
    """--log-format, --log-requests (and --log-level unless the command has its own)."""
    parser.add_argument("--log-format", default="auto", choices=FORMATS,
                        help="auto (default): text when stderr is a terminal, else json (one JSON object per line)")
    if log_level:
        parser.add_argument("--log-level", default="info", type=str.lower, choices=LEVELS)
    parser.add_argument("--log-requests", action="store_true",
                        help="one log line per request (id, trace id, model, status, latency; never its text)")
