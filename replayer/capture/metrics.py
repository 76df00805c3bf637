"""The capture proxy's own Prometheus metrics, on an injected registry (as ``replayer.metrics``).

``replayer_capture_`` prefix, base units, ``_total`` counters, labels from closed sets only:
``endpoint`` (the captured API paths), ``status`` (HTTP status class or ``none``), ``outcome``
(``rows.OUTCOMES``), ``direction``, ``reason``. docs/capture.md lists them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector

from .rows import CAPTURED, OUTCOMES

#: closed label set of replayer_capture_tokenize_failures_total
TOKENIZE_FAILURES = ("queue_full", "upstream_error", "tokenizer_error", "no_prompt")
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx", "none")


def status_class(status: int | None) -> str:
    return "none" if status is None or not 200 <= status < 600 else f"{status // 100}xx"


class CaptureMetrics:
    """Every metric of ``replayer record``; created once per process on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry = registry if registry is not None else CollectorRegistry()
        ProcessCollector(registry=registry)
        self.requests = Counter("replayer_capture_requests", "Captured requests by API path, HTTP status "
                                "class the client got and outcome", ["endpoint", "status", "outcome"],
                                registry=registry)
        for e in CAPTURED:  # every series exists from the start (a rate() needs its zero)
            self.requests.labels(e, "2xx", "ok")
        self.passed_through = Counter("replayer_capture_passthrough_requests", "Requests to other paths, "
                                      "passed through without a row", registry=registry)
        self.rows_written = Counter("replayer_capture_rows_written", "Trace rows handed to the writer "
                                    "(on disk within one flush interval)", registry=registry)
        self.bytes = Counter("replayer_capture_bytes", "Bytes proxied (bodies), by direction: request = "
                             "client to upstream, response = upstream to client", ["direction"], registry=registry)
        for d in ("request", "response"):
            self.bytes.labels(d)
        self.in_flight = Gauge("replayer_capture_requests_in_flight", "Requests being proxied now",
                               registry=registry)
        self.backlog = Gauge("replayer_capture_tokenize_backlog", "Finished requests waiting for "
                             "tokenization and hashing", registry=registry)
        self.tokenize_failures = Counter("replayer_capture_tokenize_failures", "Rows written without hash "
                                         "ids, by reason", ["reason"], registry=registry)
        for r in TOKENIZE_FAILURES:
            self.tokenize_failures.labels(r)
        self.distinct_blocks = Gauge("replayer_capture_distinct_blocks", "Distinct prompt blocks seen "
                                     "(entries of the in-memory digest table)", registry=registry)

    def request_done(self, endpoint: str, status: int | None, outcome: str) -> None:
        assert outcome in OUTCOMES, outcome
        self.requests.labels(endpoint, status_class(status), outcome).inc()
