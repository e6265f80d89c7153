"""Structured logs: JSON lines that carry the request id and trace id, and never the prompt or output text."""

from __future__ import annotations

import json
import logging
import socket

import httpx

from argosy.observe.logs import (
    ACCESS,
    JsonFormatter,
    TextFormatter,
    bind_request,
    request_id_from,
    setup_logging,
    trace_id_from,
    unbind_request,
)
from tests.gateway_fixtures import start_gateway
from tests.server_fixtures import MODEL_NAME, ServerProcess

TRACE_ID = "5cf92f3577b34da6a3ce929d0e0e4736"
PROMPT = "The quizzical marmoset juggles eleven tangerines"


def record(msg: str, *args, **extra) -> logging.LogRecord:
    rec = logging.LogRecord("argosy.test", logging.WARNING, __file__, 1, msg, args, None)
    rec.__dict__.update(extra)
    return rec


def test_json_lines_carry_the_bound_request_ids_and_extra_fields():
    fmt = JsonFormatter()
    assert "request_id" not in json.loads(fmt.format(record("outside a request")))
    token = bind_request("req-1", TRACE_ID)
    try:
        line = fmt.format(record("upstream %s failed", "http://u1", upstream="http://u1", status=502))
    finally:
        unbind_request(token)
    obj = json.loads(line)
    assert obj["level"] == "warning" and obj["logger"] == "argosy.test" and obj["msg"] == "upstream http://u1 failed"
    assert obj["request_id"] == "req-1" and obj["trace_id"] == TRACE_ID
    assert obj["upstream"] == "http://u1" and obj["status"] == 502 and obj["ts"].endswith("Z")
    # A message that is already a JSON event (the fleet controller's) is merged, not nested as a string.
    merged = json.loads(fmt.format(record(json.dumps({"event": "replica_drained", "replica": "r1"}))))
    assert merged["event"] == "replica_drained" and merged["replica"] == "r1" and merged["msg"] == "replica_drained"
    token = bind_request("req-2", None)
    try:
        text = TextFormatter().format(record("hello", model="m"))
    finally:
        unbind_request(token)
    assert text.endswith("argosy.test: hello request_id=req-2 model=m")


def test_ids_from_headers():
    assert request_id_from(b"abc-123") == "abc-123"
    assert len(request_id_from(b"bad id with spaces\n")) == 32 and len(request_id_from(None)) == 32
    assert trace_id_from(f"00-{TRACE_ID}-00f067aa0ba902b7-01".encode()) == TRACE_ID
    assert trace_id_from(b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01") is None  # the all-zero id is invalid
    assert trace_id_from(b"garbage") is None


def test_access_log_is_off_unless_asked_for():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, ACCESS.level)
    try:
        setup_logging("json", "info", log_requests=False)
        assert not ACCESS.isEnabledFor(logging.INFO)
        setup_logging("text", "info", log_requests=True)
        assert ACCESS.isEnabledFor(logging.INFO)
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
        ACCESS.setLevel(saved[2])


def json_lines(text: str, prefix: str) -> list[dict]:
    """Every line is a JSON object, except the readable startup lines that start with `prefix`."""
    out = []
    for line in text.splitlines():
        if line.startswith(prefix):
            continue
        obj = json.loads(line)  # fails the test on any other line
        assert {"ts", "level", "logger", "msg"} <= obj.keys(), line
        out.append(obj)
    return out


def test_engine_and_gateway_log_json_with_ids_and_never_the_text(tiny_llama):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    replica = ServerProcess(tiny_llama, "--log-requests")
    gw = None
    try:
        gw = start_gateway({"models": [{"name": MODEL_NAME, "upstreams": [dead, replica.url],
                                        "routing": {"policy": "round_robin"}}]}, "--log-requests")
        outputs, ids = [], []
        for i in range(2):  # round robin: one of the two goes to the dead upstream first (a logged warning)
            rid = f"test-request-{i}"
            r = httpx.post(gw.url + "/v1/completions", timeout=60, json={
                "model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0},
                headers={"x-request-id": rid, "traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"})
            assert r.status_code == 200 and r.headers["x-request-id"] == rid
            outputs.append(r.json()["choices"][0]["text"])
            ids.append(rid)
        assert httpx.post(gw.url + "/v1/completions", json={"model": "nope", "prompt": PROMPT}).status_code == 404
        gw.popen.terminate()
        _, gateway_out = gw.popen.communicate(timeout=30)
    finally:
        if gw is not None:
            gw.stop()
        engine_out = replica.output()
        replica.stop()
    for text in (engine_out, gateway_out):
        assert "marmoset" not in text and "tangerines" not in text
        assert not [o for o in outputs if len(o.strip()) >= 4 and o in text], "output text in the logs"
    engine = json_lines(engine_out, "argosy engine: ")
    served = {o["request_id"]: o for o in engine if o["logger"] == "argosy.access"}
    assert set(served) == set(ids)  # the gateway's request id reached the replica
    for o in served.values():
        assert o["trace_id"] == TRACE_ID and o["status"] == 200 and o["model"] == MODEL_NAME
        assert o["completion_tokens"] >= 1 and o["prompt_tokens"] >= 5 and o["latency_ms"] > 0
    gateway = json_lines(gateway_out, "argosy gateway")
    access = [o for o in gateway if o["logger"] == "argosy.access"]
    assert [o["request_id"] for o in access[:2]] == ids
    assert all(o["trace_id"] == TRACE_ID and o["upstream"] == replica.url and o["status"] == 200
               for o in access[:2])
    assert access[2]["status"] == 404 and access[2]["request_id"] and "trace_id" not in access[2]
    warned = [o for o in gateway if o["level"] == "warning" and "failed before the first byte" in o["msg"]]
    assert len(warned) == 1 and warned[0]["request_id"] in ids and warned[0]["trace_id"] == TRACE_ID
