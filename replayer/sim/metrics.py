"""vLLM-named Prometheus metrics of the simulator: plain counters bumped on the hot path,
turned into metric families only when ``/metrics`` is scraped (``_Metrics``)."""

from __future__ import annotations

import time
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily


class _Served(Protocol):
    """What the metrics read of the server (``replayer.sim.server.SimServer``)."""

    config: Any
    images: Any
    prefix_cache: Any

    @property
    def num_requests_running(self) -> int: ...

    @property
    def num_requests_waiting(self) -> int: ...


# ---------------------------------------------------------------------------------------
# Metrics


class _Metrics:
    """Plain counters on the hot path; exported by ``collect`` when scraped."""

    def __init__(self, server: _Served) -> None:
        self._server = server
        self.created = time.time()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.success = 0  # finished_reason="length" (every generation request)
        self.success_stop = 0  # finished_reason="stop" (pooling requests)
        # per finished generation request: (sum of seconds, count) of vLLM's request histograms,
        # exported with the +Inf bucket only (what the replayer reads: sum and count)
        self.ttft = [0.0, 0]
        self.e2e = [0.0, 0]
        self.queue = [0.0, 0]
        self.itl = [0.0, 0]

    def observe(
        self, queued_s: float, scheduled_s: float | None, first_s: float | None, end_s: float, tokens: int = 0
    ) -> None:
        """A generation request ended: its time to first token, end-to-end time, queue time and,
        over its ``tokens`` generated, the gaps between them (``time.perf_counter`` seconds;
        unknown parts left out, as vLLM does)."""
        if first_s is None:
            return
        if tokens > 1:
            self.itl[0] += end_s - first_s
            self.itl[1] += tokens - 1
        for acc, v in ((self.ttft, first_s - queued_s), (self.e2e, end_s - queued_s)):
            acc[0] += v
            acc[1] += 1
        if scheduled_s is not None:
            self.queue[0] += scheduled_s - queued_s
            self.queue[1] += 1

    def collect(self):  # prometheus_client Collector protocol
        s = self._server
        labels = ["engine", "model_name"]
        values = ["0", s.config.model]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            m = CounterMetricFamily(name, doc, labels=labels, created=self.created)
            m.add_metric(values, value, created=self.created)
            return m

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            m = GaugeMetricFamily(name, doc, labels=labels)
            m.add_metric(values, value)
            return m

        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens)
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            self.prefix_queries,
        )
        yield counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", self.prefix_hits
        )
        yield counter(
            "vllm:mm_cache_queries",
            "Multi-modal cache queries, in terms of number of queried items.",
            s.images.queries,
        )
        yield counter(
            "vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", s.images.hits
        )
        m = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=labels + ["finished_reason"],
            created=self.created,
        )
        # vLLM's label order (stop, length); pooling requests finish with "stop".
        m.add_metric(values + ["stop"], self.success_stop, created=self.created)
        m.add_metric(values + ["length"], self.success, created=self.created)
        yield m
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", 0)  # (none here)
        for name, doc, (total, n) in (
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", self.e2e),
            ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", self.queue),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl),
        ):
            h = HistogramMetricFamily(name, doc, labels=labels)
            h.add_metric(values, [("+Inf", n)], total)
            yield h
        yield gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", s.num_requests_running
        )
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.num_requests_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.prefix_cache.usage())
