"""The capture proxy's own Prometheus metrics, on an injected registry (as ``replayer.observe.metrics``).

``replayer_capture_`` prefix, base units, ``_total`` counters, labels from closed sets only:
``endpoint`` (the captured API paths), ``status`` (HTTP status class or ``none``), ``outcome``
(``rows.OUTCOMES``), ``direction``, ``reason``. docs/capture.md lists them.
"""

from __future__ import annotations

import bisect

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from replayer.capture.rows import CAPTURED, OUTCOMES

#: closed label set of replayer_capture_tokenize_failures_total
TOKENIZE_FAILURES = ("queue_full", "upstream_error", "tokenizer_error", "no_prompt")
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx", "none")


def status_class(status: int | None) -> str:
    return "none" if status is None or not 200 <= status < 600 else f"{status // 100}xx"


#: replayer_capture_forward_delay_seconds' bucket bounds (the issue's target, 1 ms, is one)
FORWARD_DELAY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
DIRECTIONS = ("request", "response")


class ForwardDelay(Collector):
    """``replayer_capture_forward_delay_seconds{direction}``: how long bytes stayed in the proxy,
    from their arrival (the kernel's receive stamp, ``stamps``) to their write to the next hop.
    ``request``: a captured request's last byte to its write upstream. ``response``: each read of
    a captured response (its newest bytes) to its write to the client, so the first observation
    of a stream is the TTFT the proxy added and the others its ITL, but for the loopback hop.

    Counted here, not with ``prometheus_client.Histogram``: the response side observes once per
    streamed event (~12,000/s on W1 at 10x), where ``Histogram.observe`` costs ~2 us (a lock and
    a search per call) and this ~0.2 us; the exposition is prometheus_client's, at scrape time."""

    def __init__(self) -> None:
        self._bounds_ns = [round(b * 1e9) for b in FORWARD_DELAY_BUCKETS]
        self._counts = {d: [0] * (len(FORWARD_DELAY_BUCKETS) + 1) for d in DIRECTIONS}
        self._sum_ns = dict.fromkeys(DIRECTIONS, 0)

    def observer(self, direction: str):
        """``observe(delay_ns)`` for one direction (a closure: no label lookup per call)."""
        counts, bounds, sums, search = self._counts[direction], self._bounds_ns, self._sum_ns, bisect.bisect_left

        def observe(delay_ns: int) -> None:
            if delay_ns < 0:  # (the clocks' offset is sampled to ~20 us: a hair under zero is zero)
                delay_ns = 0
            counts[search(bounds, delay_ns)] += 1
            sums[direction] += delay_ns

        return observe

    def buckets(self, direction: str) -> list[tuple[float, int]]:
        """Cumulative (upper bound in seconds, count) pairs, ``+Inf`` last."""
        out, acc = [], 0
        for bound, n in zip([*FORWARD_DELAY_BUCKETS, float("inf")], self._counts[direction]):
            acc += n
            out.append((bound, acc))
        return out

    def collect(self):
        h = HistogramMetricFamily(
            "replayer_capture_forward_delay_seconds",
            "Time bytes of captured "
            "requests stayed in the proxy, from their arrival (kernel receive stamp) to "
            "their write to the next hop, by direction: request = last byte to the "
            "upstream, response = each read of the response to the client",
            labels=["direction"],
        )
        for d in DIRECTIONS:
            h.add_metric(
                [d], [(str(b) if b != float("inf") else "+Inf", n) for b, n in self.buckets(d)], self._sum_ns[d] / 1e9
            )
        yield h


class CaptureMetrics:
    """Every metric of ``replayer record``; created once per process on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry = registry if registry is not None else CollectorRegistry()
        ProcessCollector(registry=registry)
        self.requests = Counter(
            "replayer_capture_requests",
            "Captured requests by API path, HTTP status class the client got and outcome",
            ["endpoint", "status", "outcome"],
            registry=registry,
        )
        for e in CAPTURED:  # every series exists from the start (a rate() needs its zero)
            self.requests.labels(e, "2xx", "ok")
        self.passed_through = Counter(
            "replayer_capture_passthrough_requests",
            "Requests to other paths, passed through without a row",
            registry=registry,
        )
        self.rows_written = Counter(
            "replayer_capture_rows_written",
            "Trace rows handed to the writer (on disk within one flush interval)",
            registry=registry,
        )
        self.bytes = Counter(
            "replayer_capture_bytes",
            "Bytes proxied (bodies), by direction: request = client to upstream, response = upstream to client",
            ["direction"],
            registry=registry,
        )
        for d in ("request", "response"):
            self.bytes.labels(d)
        self.in_flight = Gauge("replayer_capture_requests_in_flight", "Requests being proxied now", registry=registry)
        self.backlog = Gauge(
            "replayer_capture_tokenize_backlog",
            "Finished requests waiting for tokenization and hashing",
            registry=registry,
        )
        self.tokenize_failures = Counter(
            "replayer_capture_tokenize_failures",
            "Rows written without hash ids, by reason",
            ["reason"],
            registry=registry,
        )
        for r in TOKENIZE_FAILURES:
            self.tokenize_failures.labels(r)
        self.forward_delay = ForwardDelay()
        registry.register(self.forward_delay)
        self.distinct_blocks = Gauge(
            "replayer_capture_distinct_blocks",
            "Distinct prompt blocks seen (entries of the in-memory digest table)",
            registry=registry,
        )

    def request_done(self, endpoint: str, status: int | None, outcome: str) -> None:
        assert outcome in OUTCOMES, outcome
        self.requests.labels(endpoint, status_class(status), outcome).inc()
