"""Prometheus metrics of an encoder replica, under vLLM's names where one exists (docs/metrics.md).

The gateway's scraper reads `vllm:num_requests_waiting` as it does from an LLM replica; the fleet's
encoder metric is `argosy:encoder_queued_tokens`, the tokens waiting in the replica's queue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from argosy.encoder.engine import EncoderOutput
from argosy.server.metrics import REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS

LABELS = ["model_name"]


class _QueueCollector(Collector):
    def __init__(self, model_name: str, queue: Callable[[], dict[str, Any]]):
        self._model, self._queue = [model_name], queue

    def collect(self) -> Iterator[Metric]:
        q = self._queue()
        for name, doc, key in (
            ("vllm:num_requests_running", "Requests with inputs in the running batch.", "running"),
            ("vllm:num_requests_waiting", "Requests waiting for their inputs to run.", "waiting"),
            ("argosy:encoder_queued_tokens", "Tokens of the inputs waiting to run.", "queued_tokens"),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=LABELS)
            gauge.add_metric(self._model, float(q.get(key, 0)))
            yield gauge


class EncoderMetrics:
    def __init__(self, model_name: str, queue: Callable[[], dict[str, Any]]):
        self.registry = CollectorRegistry(auto_describe=True)
        self.model = model_name
        self.requests = Counter("vllm:request_success", "Requests answered.", LABELS, registry=self.registry)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Input tokens encoded.", LABELS, registry=self.registry)
        self.inputs = Counter("argosy:encoder_inputs", "Inputs (texts or pairs) encoded.", LABELS,
                              registry=self.registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Arrival to answer, in seconds.", LABELS,
                             buckets=REQUEST_LATENCY_BUCKETS, registry=self.registry)
        self.queue_time = Histogram("vllm:request_queue_time_seconds", "Arrival to first batch, in seconds.",
                                    LABELS, buckets=TTFT_BUCKETS, registry=self.registry)
        self.registry.register(_QueueCollector(model_name, queue))

    def on_finished(self, out: EncoderOutput) -> None:
        m = self.model
        self.requests.labels(m).inc()
        self.prompt_tokens.labels(m).inc(out.num_tokens)
        self.inputs.labels(m).inc(out.data.shape[0])
        self.e2e.labels(m).observe(out.e2e_s)
        self.queue_time.labels(m).observe(out.queue_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
