"""The declaration of every fixed replayer metric: one row per metric (attribute, kind, name,
help, labels, buckets), made by ``declare`` on a registry. ``ReplayerMetrics`` holds each as the
row's attribute; docs/metrics.md describes each name (``tests/test_metrics.py`` checks the page
against a registry made from this table). The metrics computed at scrape time (requests due, the
results folder, the run's labels and events) are collectors of their own modules."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from replayer.observe.histograms import (
    COARSE_LATENCY_BUCKETS,
    COARSE_TOKEN_BUCKETS,
    LAG_BUCKETS,
    LATENCY_BUCKETS,
    LOOP_LAG_BUCKETS,
    TOKEN_LATENCY_BUCKETS,
    BatchedHistogram,
)


class Spec(NamedTuple):
    """One metric: ``kind`` is counter, gauge, info, histogram (observed one value at a time by
    its caller) or batched (a ``BatchedHistogram`` under the metrics' lock)."""

    attr: str
    kind: str
    name: str
    doc: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()


def _c(attr: str, name: str, doc: str, *labels: str) -> Spec:
    return Spec(attr, "counter", name, doc, labels)


def _g(attr: str, name: str, doc: str) -> Spec:
    return Spec(attr, "gauge", name, doc)


def _h(attr: str, name: str, doc: str, buckets: tuple[float, ...]) -> Spec:
    return Spec(attr, "batched", name, doc, (), buckets)


METRICS: tuple[Spec, ...] = (
    Spec("build_info", "info", "replayer_build", "Version of replayer."),
    Spec("config_info", "info", "replayer_config", "Key settings of this run (bounded set)."),
    _c("scheduled", "replayer_requests_scheduled", "Requests put on the schedule."),
    _c("sent", "replayer_requests_sent", "Requests sent to the target."),
    _c("requests", "replayer_requests", "Requests finished, by outcome and error kind.", "outcome", "error_kind"),
    _c(
        "retries",
        "replayer_request_retries",
        "Re-sends of requests after a retryable failure "
        "(HTTP 429/5xx or a connection failure before any response byte).",
    ),
    _g("in_flight", "replayer_requests_in_flight", "Requests sent and not yet finished."),
    _h("ttft", "replayer_ttft_seconds", "Time to first token of successful requests.", LATENCY_BUCKETS),
    _h("e2e", "replayer_e2e_latency_seconds", "Send to last token of successful requests.", LATENCY_BUCKETS),
    _h(
        "ttft_from_due",
        "replayer_ttft_from_due_seconds",
        "Time to first token of successful requests from their due time "
        "(a held session turn's release): TTFT plus the time to the send.",
        COARSE_LATENCY_BUCKETS,
    ),
    _h(
        "e2e_from_due",
        "replayer_e2e_latency_from_due_seconds",
        "Due time (a held session turn's release) to last token of successful "
        "requests: E2E latency plus the time to the send.",
        COARSE_LATENCY_BUCKETS,
    ),
    _c(
        "slo_requests",
        "replayer_slo_requests",
        "Requests judged against the --goodput bounds, by "
        "bound (ttft, tpot, e2el; all = every bound) and result (met, missed, unknown); "
        "failed requests are missed. Only the bounds set are exported.",
        "slo",
        "result",
    ),
    _h("tpot", "replayer_tpot_seconds", "Time per output token after the first.", TOKEN_LATENCY_BUCKETS),
    _h("itl", "replayer_itl_seconds", "Inter-token latency (token-weighted).", TOKEN_LATENCY_BUCKETS),
    _h(
        "client_overhead",
        "replayer_client_overhead_seconds",
        "Client TTFT minus the server's own queue time and TTFT (--server-timings; successful requests "
        "whose server reported both): network, the server's front end and this client.",
        COARSE_TOKEN_BUCKETS,
    ),
    _h(
        "lag",
        "replayer_dispatch_lag_seconds",
        "Dispatch time (the kernel took the request's last byte) minus due time (negative = early).",
        LAG_BUCKETS,
    ),
    _h(
        "session_wait",
        "replayer_session_wait_seconds",
        "Time a turn was held back for its predecessor (or parent) to end "
        "(the server's slowness; not in dispatch lag).",
        COARSE_LATENCY_BUCKETS,
    ),
    _c(
        "pooling_audit",
        "replayer_pooling_usage_audits",
        "Pooling responses (embeddings, score, rerank) by usage audit result: ok, "
        "inflated (more prompt tokens than both expectations), missing.",
        "endpoint",
        "result",
    ),
    _c("prompt_tokens_sent", "replayer_prompt_tokens_sent", "Prompt token ids sent."),
    _c("server_prompt_tokens", "replayer_server_prompt_tokens", "Prompt tokens reported by the server's usage."),
    _c(
        "server_completion_tokens",
        "replayer_server_completion_tokens",
        "Completion tokens reported by the server's usage.",
    ),
    _c(
        "usage_mismatch",
        "replayer_usage_mismatches",
        "Successful requests whose server usage differs from the trace.",
        "field",
    ),
    _c(
        "otel_spans_exported",
        "replayer_otel_spans_exported",
        "OpenTelemetry spans the collector accepted (--otlp-endpoint).",
    ),
    _c(
        "otel_spans_dropped",
        "replayer_otel_spans_dropped",
        "OpenTelemetry spans dropped: the collector refused or did not answer, or the export queue was full.",
    ),
    _c("images_sent", "replayer_images_sent", "Images sent (multimodal rows)."),
    _c("image_bytes_sent", "replayer_image_bytes_sent", "Encoded bytes of the images sent (before base64)."),
    _c(
        "image_tokens",
        "replayer_image_tokens",
        "Image tokens of requests that ended: server = "
        "usage.prompt_tokens_details.image_tokens (when reported), expected = the "
        "trace's image_tokens or --image-token-rule.",
        "source",
    ),
    _c(
        "image_token_mismatches",
        "replayer_image_token_mismatches",
        "Successful requests whose server-reported image tokens differ from the expected count.",
    ),
    _c(
        "prefix_hit_tokens",
        "replayer_expected_prefix_cache_hit_tokens",
        "Prompt tokens the trace's hash ids say a prefix cache could serve (expected hits).",
    ),
    _c(
        "prefix_query_tokens",
        "replayer_expected_prefix_cache_query_tokens",
        "Prompt tokens looked up in the expected prefix cache.",
    ),
    _g("trace_rows", "replayer_trace_rows", "Rows on the schedule per loop of the trace."),
    _g(
        "trace_rows_done",
        "replayer_trace_rows_done",
        "Rows of the current loop whose request finished (any outcome).",
    ),
    _g(
        "speedup",
        "replayer_speedup",
        "Trace seconds replayed per wall-clock second now "
        "(follows POST /speedup; replayer_config_info keeps the value at start).",
    ),
    _g(
        "trace_duration",
        "replayer_trace_duration_seconds",
        "Trace time spanned by one loop's schedule (seconds of trace time; 0 when "
        "not known before the replay reads it).",
    ),
    _g(
        "trace_time",
        "replayer_trace_time_seconds",
        "Trace time reached: trace offset of the last request sent.",
    ),
    _g("loop", "replayer_loop", "Current loop over the trace (0 = first pass)."),
    Spec(
        "loop_lag",
        "histogram",
        "replayer_event_loop_lag_seconds",
        "Overshoot of the replayer's own event-loop sleeps.",
        (),
        LOOP_LAG_BUCKETS,
    ),
    _g(
        "loop_lag_max",
        "replayer_event_loop_lag_max_seconds",
        "Largest event-loop sleep overshoot of the last window (about 10 s).",
    ),
)


def declare(registry: CollectorRegistry, lock: AbstractContextManager) -> dict[str, Any]:
    """Every row of ``METRICS`` made on ``registry`` (batched histograms under ``lock``), by attribute."""
    out: dict[str, Any] = {}
    for s in METRICS:
        if s.kind == "counter":
            out[s.attr] = Counter(s.name, s.doc, s.labels, registry=registry)
        elif s.kind == "gauge":
            out[s.attr] = Gauge(s.name, s.doc, registry=registry)
        elif s.kind == "info":
            out[s.attr] = Info(s.name, s.doc, registry=registry)
        elif s.kind == "histogram":
            out[s.attr] = Histogram(s.name, s.doc, buckets=s.buckets, registry=registry)
        else:
            out[s.attr] = BatchedHistogram(s.name, s.doc, s.buckets, registry, lock=lock)
    return out
