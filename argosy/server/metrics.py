"""Prometheus metrics under vLLM's names, buckets and `model_name` label (docs/metrics.md).

Request histograms and token counters are updated on the event loop from the outputs the engine
delivers (`OutputObserver`); the engine-state gauges and the prefix-cache counters are read from the
engine's stats snapshot at scrape time, so a step pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from argosy.engine.outputs import RequestOutput

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
FINISH_REASONS = ("stop", "length", "abort")
LABELS = ["model_name"]


class _EngineStatsCollector(Collector):
    """Gauges and cumulative counters straight from the engine's stats snapshot."""

    def __init__(self, model_name: str, stats: Callable[[], dict[str, Any]]):
        self._model = [model_name]
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        for name, doc, key in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", "num_running"),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "num_waiting"),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_cache_usage"),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=LABELS)
            gauge.add_metric(self._model, float(stats.get(key, 0)))
            yield gauge
        for name, doc, key in (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
             "prefix_cache_queries"),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             "prefix_cache_hits"),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "num_preemptions"),
        ):
            counter = CounterMetricFamily(name, doc, labels=LABELS)
            counter.add_metric(self._model, float(stats.get(key, 0)))
            yield counter


class _Track:
    __slots__ = ("last_time", "num_generated")

    def __init__(self, last_time: float):
        self.last_time = last_time
        self.num_generated = 0


class ServerMetrics:
    """One registry per server; implements async_engine.OutputObserver."""

    def __init__(self, model_name: str, stats: Callable[[], dict[str, Any]], telemetry: Any = None):
        """telemetry: a device_telemetry.DeviceTelemetry whose series follow the engine's (or None)."""
        self.telemetry = telemetry
        self.registry = CollectorRegistry()
        reg, model = self.registry, model_name

        def histogram(name: str, doc: str, buckets: list[float]) -> Any:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=reg).labels(model)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, LABELS, registry=reg).labels(model)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          LABELS + ["finished_reason"], registry=reg)
        self.success = {reason: success.labels(model, reason) for reason in FINISH_REASONS}
        reg.register(_EngineStatsCollector(model_name, stats))
        self._live: dict[str, _Track] = {}

    def render(self) -> bytes:
        body = generate_latest(self.registry)
        return body + self.telemetry.render().encode() if self.telemetry is not None else body

    # ---- OutputObserver ----------------------------------------------------------------------------

    def on_output(self, out: RequestOutput, arrival: float, now: float) -> None:
        track = self._live.get(out.request_id)
        if track is None:  # first output: the prompt is done and the first token(s) sampled
            times = out.metrics
            first_token = times.get("first_token_time") or now
            self.ttft.observe(max(0.0, first_token - arrival))
            scheduled = times.get("first_scheduled_time")
            if scheduled:
                self.queue_time.observe(max(0.0, scheduled - arrival))
            self.prompt_tokens.inc(len(out.prompt_token_ids))
            track = self._live[out.request_id] = _Track(first_token)
        else:
            self.itl.observe(max(0.0, now - track.last_time))
            track.last_time = now
        generated = 0
        for completion in out.outputs:
            generated += len(completion.token_ids)
        if generated > track.num_generated:
            self.generation_tokens.inc(generated - track.num_generated)
            track.num_generated = generated
        if out.finished:
            del self._live[out.request_id]
            finished = out.metrics.get("finished_time") or now
            self.e2e.observe(max(0.0, finished - arrival))
            for completion in out.outputs:
                reason = self.success.get(completion.finish_reason or "abort")
                if reason is not None:
                    reason.inc()

    def on_abort(self, request_ids: list[str], num_completions: int) -> None:
        for rid in request_ids:
            self._live.pop(rid, None)
        self.success["abort"].inc(num_completions)
