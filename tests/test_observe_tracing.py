"""Traces: one trace per request, from the caller's traceparent through the gateway to the replica's engine.

1. In process (the SDK's in-memory exporter): a real gateway and a real engine server, each on its own
   127.0.0.1 port, driven by the official openai client; checks the whole span tree, retries included.
2. Subprocesses (`argosy gateway` / `argosy engine --otlp-endpoint`) exporting over OTLP/HTTP to a real
   receiver on loopback that decodes the protobuf.
"""

from __future__ import annotations

import asyncio
import gzip
import http.server
import socket
import threading
import time

import httpx
import openai
import pytest

from argosy.observe.tracing import Tracing, traces_url
from tests.gateway_fixtures import start_gateway
from tests.server_fixtures import MODEL_NAME, ServerProcess

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
PROMPT = "Tell me about the periwinkle zeppelin"


def traceparent(trace_id: str = TRACE_ID) -> str:
    return f"00-{trace_id}-{CLIENT_SPAN}-01"


class ThreadServer:
    """An ASGI app under uvicorn in a thread of its own, on a free 127.0.0.1 port."""

    def __init__(self, app):
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])),
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def dead_url() -> str:
    with socket.socket() as s:  # bound then closed: connections are refused
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_traces_url():
    assert traces_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("http://c:4318/v1/traces/") == "http://c:4318/v1/traces"


def test_span_tree_in_process_with_retry_and_client_traceparent(tiny_llama):
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from argosy.config import parse_fleet
    from argosy.engine.config import EngineConfig
    from argosy.engine.llm_engine import LLMEngine
    from argosy.gateway.app import Gateway
    from argosy.server.app import build_app

    exported = InMemorySpanExporter()
    cfg = EngineConfig(model=tiny_llama, kv_cache_memory_gib=0.02)
    engine_app = build_app(MODEL_NAME, lambda: LLMEngine(cfg, served_model_name=MODEL_NAME), max_queue=64,
                           max_body_bytes=1 << 20,
                           tracing=Tracing("argosy-engine", processor=SimpleSpanProcessor(exported)))
    servers = [ThreadServer(engine_app)]
    try:
        replica = servers[0].url
        deadline = time.monotonic() + 120
        while httpx.get(replica + "/ready").status_code != 200:
            assert time.monotonic() < deadline, "the engine did not get ready"
            time.sleep(0.1)
        # A dead upstream first in round-robin order: one of two requests fails over to the replica.
        fleet = parse_fleet({"models": [{"name": MODEL_NAME, "upstreams": [dead_url(), replica],
                                         "routing": {"policy": "round_robin"}}]}, "test")
        gateway = Gateway(fleet)
        gateway.tracing = Tracing("argosy-gateway", processor=SimpleSpanProcessor(exported))
        servers.append(ThreadServer(gateway))
        client = openai.OpenAI(base_url=servers[1].url + "/v1", api_key="none", max_retries=0,
                               default_headers={"traceparent": traceparent()})
        raw = client.completions.with_raw_response.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6,
                                                          temperature=0)
        output = raw.parse().choices[0].text
        request_id = raw.headers["x-request-id"]
        other = "0af7651916cd43dd8448eb211c80319c"
        chunks = list(client.with_options(default_headers={"traceparent": traceparent(other)}).chat.completions
                      .create(model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}], max_tokens=5,
                              stream=True))
        assert chunks
        plain = openai.OpenAI(base_url=servers[1].url + "/v1", api_key="none", max_retries=0)
        no_parent = plain.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
        assert no_parent.choices
    finally:
        for s in reversed(servers):
            s.stop()  # the engine's lifespan shuts its Tracing down: every span is exported by then

    spans = exported.get_finished_spans()
    by_trace: dict[int, list] = {}
    for s in spans:
        by_trace.setdefault(s.context.trace_id, []).append(s)
    assert len(by_trace) == 3, "one trace per request"
    retried = 0
    for tid, trace_spans in by_trace.items():
        def named(name, ss=trace_spans):
            return [s for s in ss if s.name == name]

        gw_server = [s for s in trace_spans if s.name.startswith("POST ") and
                     s.resource.attributes["service.name"] == "argosy-gateway"]
        assert len(gw_server) == 1
        root = gw_server[0]
        if format(tid, "032x") in (TRACE_ID, other):  # the caller's trace continues: its span is the parent
            assert root.parent is not None and format(root.parent.span_id, "016x") == CLIENT_SPAN
        else:
            assert root.parent is None
        for name in ("gateway.admission", "gateway.route", "gateway.upstream"):
            assert named(name) and all(s.parent.span_id == root.context.span_id for s in named(name)), name
        ups = sorted(named("gateway.upstream"), key=lambda s: s.start_time)
        if len(ups) == 2:  # the dead upstream first, then the retry on the replica: sibling spans
            retried += 1
            assert not ups[0].status.is_ok and "http.response.status_code" not in ups[0].attributes
        final = ups[-1]
        assert final.attributes["argosy.upstream"] == replica
        assert final.attributes["http.response.status_code"] == 200 and "argosy.ttft_ms" in final.attributes
        assert [e.name for e in final.events] == ["first_token"]
        eng_server = [s for s in trace_spans if s.resource.attributes["service.name"] == "argosy-engine"
                      and s.name.startswith("POST ")]
        assert len(eng_server) == 1 and eng_server[0].parent.span_id == final.context.span_id
        es = eng_server[0]
        assert es.attributes["argosy.request_id"] == root.attributes["argosy.request_id"]
        queue, prefill, decode = named("engine.queue"), named("engine.prefill"), named("engine.decode")
        assert len(queue) == len(prefill) == len(decode) == 1
        for s in (*queue, *prefill, *decode):
            assert s.parent.span_id == es.context.span_id
        assert queue[0].start_time <= queue[0].end_time <= prefill[0].end_time <= decode[0].end_time
        assert es.start_time <= queue[0].start_time + 1_000_000 and decode[0].end_time <= es.end_time
        assert prefill[0].attributes["gen_ai.usage.input_tokens"] > 0
        assert 1 <= decode[0].attributes["gen_ai.usage.output_tokens"] <= 6
        own = {s.context.span_id for s in trace_spans}
        assert all(s.parent.span_id in own for s in trace_spans if s is not root)  # no orphans
    assert retried == 1
    first = next(s for s in spans if s.name == "POST /v1/completions" and format(s.context.trace_id, "032x") ==
                 TRACE_ID and s.resource.attributes["service.name"] == "argosy-gateway")
    assert first.attributes["argosy.request_id"] == request_id
    assert first.attributes["http.response.status_code"] == 200
    assert first.attributes["argosy.model"] == MODEL_NAME
    # Token counts, never text: neither the prompt nor the output is in any attribute.
    values = [str(v) for s in spans for v in s.attributes.values()]
    assert not [v for v in values if "periwinkle" in v or (output.strip() and output in v)]


class Receiver(http.server.ThreadingHTTPServer):
    """A minimal OTLP/HTTP trace receiver: POST /v1/traces with an ExportTraceServiceRequest (protobuf)."""

    def __init__(self):
        self.spans: list[tuple[str, object]] = []  # (service.name, Span)
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                    ExportTraceServiceRequest,
                    ExportTraceServiceResponse,
                )

                body = self.rfile.read(int(self.headers["content-length"]))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces" and self.headers["content-type"] == "application/x-protobuf"
                if ok:
                    req = ExportTraceServiceRequest.FromString(body)
                    with receiver.lock:
                        for rs in req.resource_spans:
                            service = next(a.value.string_value for a in rs.resource.attributes
                                           if a.key == "service.name")
                            receiver.spans += [(service, s) for ss in rs.scope_spans for s in ss.spans]
                out = ExportTraceServiceResponse().SerializeToString() if ok else b""
                self.send_response(200 if ok else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def of_trace(self, trace_id: str) -> list[tuple[str, object]]:
        with self.lock:
            return [(svc, s) for svc, s in self.spans if s.trace_id.hex() == trace_id]


def test_subprocesses_export_over_otlp_http_to_a_real_receiver(tiny_llama, monkeypatch):
    receiver = Receiver()
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s (default 5 s)
    replica = gw = None
    try:
        replica = ServerProcess(tiny_llama, "--otlp-endpoint", receiver.url)
        gw = start_gateway({"models": [{"name": MODEL_NAME, "upstreams": [replica.url]}]},
                           "--otlp-endpoint", receiver.url, env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0,
                               default_headers={"traceparent": traceparent()})
        assert client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=4).usage.completion_tokens == 4
        deadline = time.monotonic() + 20
        while len(receiver.of_trace(TRACE_ID)) < 8:  # 4 gateway spans + 4 engine spans
            assert time.monotonic() < deadline, [s.name for _, s in receiver.of_trace(TRACE_ID)]
            time.sleep(0.1)
    finally:
        if gw is not None:
            gw.stop()
        if replica is not None:
            replica.stop()
        receiver.shutdown()
    got = receiver.of_trace(TRACE_ID)
    assert len(got) == 8, sorted(s.name for _, s in got)
    by_name = {s.name: (svc, s) for svc, s in got}  # the two server spans share a name; found by service below

    def parent_of(name: str) -> str:
        return by_name[name][1].parent_span_id.hex()

    def id_of(name: str) -> str:
        return by_name[name][1].span_id.hex()

    services = {name: svc for name, (svc, _) in by_name.items()}
    root = "POST /v1/completions"
    gateway_root = next(s for svc, s in got if s.name == root and svc == "argosy-gateway")
    engine_root = next(s for svc, s in got if s.name == root and svc == "argosy-engine")
    assert gateway_root.parent_span_id.hex() == CLIENT_SPAN
    for name in ("gateway.admission", "gateway.route", "gateway.upstream"):
        assert services[name] == "argosy-gateway" and parent_of(name) == gateway_root.span_id.hex()
    assert engine_root.parent_span_id.hex() == id_of("gateway.upstream")
    for name in ("engine.queue", "engine.prefill", "engine.decode"):
        assert services[name] == "argosy-engine" and parent_of(name) == engine_root.span_id.hex()


@pytest.mark.parametrize("command", [["engine"], ["gateway"], ["serve"]])
def test_otlp_endpoint_flag_is_accepted(command):
    from argosy.cli import main

    with pytest.raises(SystemExit) as e:
        main([*command, "--otlp-endpoint", "http://127.0.0.1:4318", "--log-format", "yaml"])
    assert e.value.code == 2  # the bad --log-format is what fails: --otlp-endpoint itself parsed


def test_serve_passes_the_endpoint_to_the_replicas_it_starts(tiny_llama, monkeypatch):
    from tests.fleet_fixtures import Serve, ready, tiny_fleet

    receiver = Receiver()
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    fleet = tiny_fleet(tiny_llama, min_replicas=1, max_replicas=1)
    fleet["gateway"]["otlp_endpoint"] = receiver.url  # the fleet file's field (the gateway test used the flag)
    serve = Serve(fleet)
    try:
        serve.wait_for("a ready replica", lambda st: len(ready(st)) == 1)
        r = httpx.post(serve.url + "/v1/completions", headers={"traceparent": traceparent()}, timeout=60,
                       json={"model": "tiny", "prompt": PROMPT, "max_tokens": 3})
        assert r.status_code == 200
        deadline = time.monotonic() + 20
        while {svc for svc, _ in receiver.of_trace(TRACE_ID)} != {"argosy-gateway", "argosy-engine"}:
            assert time.monotonic() < deadline, receiver.of_trace(TRACE_ID)
            time.sleep(0.1)
    finally:
        serve.stop()
        receiver.shutdown()
    engine_root = next(s for svc, s in receiver.of_trace(TRACE_ID) if svc == "argosy-engine" and
                       s.name == "POST /v1/completions")
    upstream = next(s for svc, s in receiver.of_trace(TRACE_ID) if s.name == "gateway.upstream")
    assert engine_root.parent_span_id == upstream.span_id
