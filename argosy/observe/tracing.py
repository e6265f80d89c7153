"""OpenTelemetry traces, off by default: exported over OTLP/HTTP only when an `otlp_endpoint` is set.

One trace per request. The gateway's server span continues the caller's W3C `traceparent` (when sent)
and has the children gateway.admission, gateway.route and one gateway.upstream span per attempt (a
retry is a second upstream span); each upstream span injects its own `traceparent` into the request to
the replica. The replica's server span continues that, with children engine.queue, engine.prefill and
engine.decode, built after the request finished from the timestamps the engine records anyway (so the
engine thread does no tracing work). Attributes carry token counts, never text.

With no endpoint `make_tracing` returns None and callers skip all of this behind one `is None` test;
the SDK is imported only when tracing is on.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Mapping
from typing import Any

TRACES_PATH = "/v1/traces"


def traces_url(endpoint: str) -> str:
    """`http://host:4318` -> `http://host:4318/v1/traces` (the OTLP/HTTP convention); a full URL is kept."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


def wall_ns(monotonic_s: float) -> int:
    """A time.monotonic() reading (what the engine records) as epoch nanoseconds (what spans carry)."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


class Tracing:
    """A tracer provider of its own (not the global one: tests run several services in one process)."""

    def __init__(self, service_name: str, endpoint: str | None = None, processor: Any = None):
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}),
                                       shutdown_on_exit=False)  # shutdown() is called on the app's way out
        if processor is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            # Batching: spans leave on a background thread; a request only appends to a queue.
            processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint or "")))
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("argosy")

    def start_request(self, name: str, traceparent: bytes | None, attributes: Mapping[str, Any]) -> RequestTrace:
        return RequestTrace(self.tracer, name, traceparent, attributes)

    def shutdown(self) -> None:
        """Exports what is queued, then stops (blocking: call it off the event loop)."""
        self.provider.shutdown()


def make_tracing(service_name: str, endpoint: str | None) -> Tracing | None:
    return Tracing(service_name, endpoint) if endpoint else None


@functools.cache
def _propagator() -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


class RequestTrace:
    """One request's server span, and the children hung under it."""

    __slots__ = ("tracer", "span", "ctx", "trace_id")

    def __init__(self, tracer: Any, name: str, traceparent: bytes | None, attributes: Mapping[str, Any]):
        from opentelemetry.trace import SpanKind, set_span_in_context

        parent = None
        if traceparent:
            parent = _propagator().extract({"traceparent": traceparent.decode("latin-1")})
        self.tracer = tracer
        self.span = tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        self.ctx = set_span_in_context(self.span)
        self.trace_id = format(self.span.get_span_context().trace_id, "032x")

    def child(self, name: str, attributes: Mapping[str, Any] | None = None, client: bool = False,
              start_s: float | None = None) -> Any:
        """A started child span (end it); `start_s` is a time.monotonic() reading, default now."""
        from opentelemetry.trace import SpanKind

        return self.tracer.start_span(name, context=self.ctx, kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
                                      attributes=attributes,
                                      start_time=None if start_s is None else wall_ns(start_s))

    def record(self, name: str, start_s: float, end_s: float, attributes: Mapping[str, Any]) -> None:
        """A child span after the fact, from two time.monotonic() readings."""
        span = self.child(name, attributes, start_s=start_s)
        span.end(end_time=wall_ns(max(start_s, end_s)))

    def inject(self, span: Any, headers: dict[str, str]) -> dict[str, str]:
        """`headers` plus the W3C traceparent of `span`: the next hop continues the trace under it."""
        from opentelemetry.trace import set_span_in_context

        out = dict(headers)
        out.pop("traceparent", None)
        _propagator().inject(out, context=set_span_in_context(span))
        return out

    def end(self, status: int, attributes: Mapping[str, Any] | None = None) -> None:
        set_http_status(self.span, status)
        if attributes:
            self.span.set_attributes(attributes)
        self.span.end()


def set_http_status(span: Any, status: int, error: str | None = None) -> None:
    from opentelemetry.trace import Status, StatusCode

    if status:
        span.set_attribute("http.response.status_code", status)
    if error is not None or status >= 500 or status == 0:
        span.set_status(Status(StatusCode.ERROR, error or f"HTTP {status}"))


def mark_first_token(span: Any, t0: float) -> None:
    """The upstream's first byte reached the gateway (`t0`: the request's arrival, time.monotonic())."""
    span.add_event("first_token")
    span.set_attribute("argosy.ttft_ms", round((time.monotonic() - t0) * 1000, 3))


def record_engine_spans(trace: RequestTrace, finals: Iterable[Any]) -> None:
    """engine.queue, engine.prefill and engine.decode of each finished engine request (a RequestOutput:
    its `metrics` holds arrival_time, first_scheduled_time, first_token_time and finished_time)."""
    for out in finals:
        m = out.metrics
        arrival, finished = m.get("arrival_time"), m.get("finished_time")
        if arrival is None or finished is None:
            continue
        scheduled = m.get("first_scheduled_time") or arrival
        first_token = m.get("first_token_time") or finished
        rid = {"argosy.engine_request_id": out.request_id}
        trace.record("engine.queue", arrival, scheduled, rid)
        trace.record("engine.prefill", scheduled, first_token,
                     {**rid, "gen_ai.usage.input_tokens": len(out.prompt_token_ids),
                      "argosy.cached_tokens": out.num_cached_tokens})
        trace.record("engine.decode", first_token, finished,
                     {**rid, "gen_ai.usage.output_tokens": sum(len(c.token_ids) for c in out.outputs),
                      "argosy.completions": len(out.outputs)})
