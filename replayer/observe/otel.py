"""OpenTelemetry spans of a run (``--otlp-endpoint``): one CLIENT span per sent request, under one
run span per shard, exported over OTLP/HTTP by the SDK's batch processor (its own thread).

Nothing here runs per token or on the send path: a request's span is built from its result after
it ended (``on_result``, a step of the run's fan-out) with explicit wall-clock times (the results'
monotonic offsets from the run's anchor, mapped through the anchor's wall time), and its span id
is the one its ``traceparent`` header named (``replayer.core.tracecontext``: derived from the run
id and the row, so no table is kept). Requests the head sampling left out get no span.

Attributes follow the OpenTelemetry GenAI semantic conventions (Development status) as of
semantic-conventions v1.41.0, the GenAI client span (``{gen_ai.operation.name}
{gen_ai.request.model}``, kind CLIENT); replayer's own measurements are under ``replayer.*``. No
prompt text or token id is ever recorded.

A down or slow collector never slows the replay: the batch processor drops spans when its queue
is full; an export the collector refused or did not answer counts its spans as dropped
(``replayer_otel_spans_dropped_total``), logged once with the endpoint. At the run's end the
queue gets a few seconds to drain; what is left is dropped and counted.

The SDK is imported only when tracing is on (``RequestSpans`` is built): a run without an
endpoint imports none of it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import urlsplit

from replayer import __version__
from replayer.core.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, POOLING, RERANK, SCORE
from replayer.core.result import RequestResult
from replayer.core.tracecontext import TraceContext

log = logging.getLogger("replayer")

__all__ = ["OPERATIONS", "SEMCONV_VERSION", "RequestSpans", "headline"]

#: the GenAI semantic-conventions release whose attribute names the spans follow
SEMCONV_VERSION = "1.41.0"
#: endpoint kind -> gen_ai.operation.name (score and rerank have no well-known value: their own names)
OPERATIONS = {COMPLETIONS: "text_completion", CHAT: "chat", EMBEDDINGS: "embeddings", SCORE: "score", RERANK: "rerank"}
#: seconds the run's end waits for the queued spans to reach the collector
CLOSE_TIMEOUT_S = 5.0
#: the summary's numbers the run span carries at its end (``replayer.summary.*``)
HEADLINE = (
    "scheduled",
    "sent",
    "completed",
    "failed",
    "cancelled",
    "not_started",
    "duration",
    "request_throughput",
    "output_throughput",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "p50_tpot_ms",
    "p99_tpot_ms",
    "p50_e2el_ms",
    "p99_e2el_ms",
    "dispatch_lag_p99_ms",
    "goodput",
)


def headline(summary: dict[str, Any]) -> dict[str, float | int]:
    """The run span's summary attributes: the headline numbers the summary has (unknown left out)."""
    out: dict[str, float | int] = {}
    for k in HEADLINE:
        v = summary.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[f"replayer.summary.{k}"] = v
    return out


def _address(url: str) -> tuple[str, int]:
    u = urlsplit(url)
    return u.hostname or "", u.port or (443 if u.scheme == "https" else 80)


class RequestSpans:
    """The run's span exporter. ``url``: the OTLP/HTTP traces URL (``RunConfig.otlp_traces_url``;
    ``OTEL_EXPORTER_OTLP_HEADERS`` and ``OTEL_EXPORTER_OTLP_TIMEOUT`` apply as the SDK reads
    them); ``ids``: the run's trace context (the one the request heads were built with);
    ``target``: the single target's URL (a routed request's is its result's ``target``);
    ``dropped``/``exported``: counters (``inc(n)``) the counts also go to."""

    def __init__(
        self,
        url: str,
        ids: TraceContext,
        *,
        shard: int,
        shard_text: str,
        model: str,
        target: str,
        dropped: Any = None,
        exported: Any = None,
        max_queue_size: int | None = None,
    ) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON
        from opentelemetry.trace import (
            NonRecordingSpan,
            SpanContext,
            SpanKind,
            StatusCode,
            TraceFlags,
            set_span_in_context,
        )

        # the SDK logs every failed export; the run logs the first one (below) and counts them all
        logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
        self.url, self.ids, self.shard, self.model = url, ids, shard, model
        self.wall0_ns = 0  # (set by ``start``, at the anchor)
        self.handed = self.exported = self.failed = 0
        self._lock = threading.Lock()
        self._closed = False
        self._warned = False
        self._dropped_counter, self._exported_counter = dropped, exported
        self._ids = _PresetIds(ids.trace_id)
        exporter = _Counting(OTLPSpanExporter(endpoint=url), self._on_export)
        # (duck-typed SDK interfaces: subclassing them would import the SDK with this module)
        self._processor = BatchSpanProcessor(cast("Any", exporter), max_queue_size=max_queue_size)
        resource = Resource.create({"service.name": "replayer", "service.version": __version__})
        self._provider = TracerProvider(
            sampler=ALWAYS_ON, resource=resource, id_generator=cast("Any", self._ids), shutdown_on_exit=False
        )
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer("replayer", __version__)
        self._run_span_id = ids.run_span_id(shard)
        parent = SpanContext(ids.trace_id, self._run_span_id, is_remote=False, trace_flags=TraceFlags(1))
        self._parent = set_span_in_context(NonRecordingSpan(parent))
        self._client, self._error = SpanKind.CLIENT, StatusCode.ERROR
        self._internal = SpanKind.INTERNAL
        self._shard_text = shard_text
        self._default_address = _address(target)
        self._addresses: dict[str, tuple[str, int]] = {}
        self._base = {"gen_ai.provider.name": "openai", "gen_ai.request.model": model, "replayer.run_id": ids.run_id}

    def start(self, wall0_ns: int) -> None:
        """At the schedule's anchor: ``wall0_ns`` is its wall-clock time (Unix ns), the time result
        offset 0 maps to and the run span's start. (Built before the anchor: the SDK's import and
        exporter thread are start-up, not the first requests' lag.)"""
        self.wall0_ns = wall0_ns

    # -- per request ----------------------------------------------------------------------------
    def on_result(self, res: RequestResult) -> None:
        """The request's CLIENT span, when it was sent and is sampled (the fan-out's step). Never
        raises: a span that cannot be built is counted as dropped (the result goes on to disk)."""
        if res.sent_ns is None or self._closed or not self.ids.sampled(res.loop, res.row):
            return
        try:
            self._span(res)
        except Exception:
            self.handed += 1
            if self._dropped_counter is not None:
                self._dropped_counter.inc()
            if not self._warned:
                self._warned = True
                log.exception("OpenTelemetry: a request's span could not be built (dropped and counted)")

    def _span(self, res: RequestResult) -> None:
        w0 = self.wall0_ns
        op = OPERATIONS.get(res.endpoint, "text_completion")
        attrs = self.attributes(res, op)
        sent = res.sent_ns
        assert sent is not None  # (on_result's check)
        self._ids.next_span_id = self.ids.span_id(res.loop, res.row)
        span = self._tracer.start_span(
            f"{op} {self.model}",
            context=self._parent,
            kind=self._client,
            attributes=attrs,
            start_time=w0 + sent,
            record_exception=False,
            set_status_on_exception=False,
        )
        if res.first_token_ns is not None:
            span.add_event("first_token", timestamp=w0 + res.first_token_ns)
        if res.last_token_ns is not None:
            span.add_event("last_token", timestamp=w0 + res.last_token_ns)
        if res.outcome != "success":
            span.set_status(self._error, res.error_kind)
        end = res.end_ns if res.end_ns is not None else (res.last_token_ns or sent)
        self.handed += 1
        span.end(end_time=w0 + end)

    def attributes(self, res: RequestResult, op: str) -> dict[str, Any]:
        """A result's span attributes (None values left out: unknown is not zero)."""
        a: dict[str, Any] = dict(self._base)
        a["gen_ai.operation.name"] = op
        host, port = self._server(res.target)
        a["server.address"], a["server.port"] = host, port
        pooling = res.endpoint in POOLING
        if not pooling:
            a["gen_ai.request.max_tokens"] = res.max_tokens
            a["gen_ai.request.stream"] = True
        opt = {
            "gen_ai.usage.input_tokens": res.prompt_tokens,
            "gen_ai.usage.output_tokens": res.completion_tokens,
            "gen_ai.response.time_to_first_chunk": None if res.ttft_ms is None else res.ttft_ms / 1000.0,
            "gen_ai.conversation.id": res.session_id,
            "replayer.row": res.row,
            "replayer.loop": res.loop,
            "replayer.shard": self._shard_text,
            "replayer.outcome": res.outcome,
            "replayer.due_ns": res.due_ns,
            "replayer.due_time_unix_nano": self.wall0_ns + res.due_ns,
            "replayer.dispatch_lag_ms": res.dispatch_lag_ms,
            "replayer.ttft_ms": res.ttft_ms,
            "replayer.e2e_ms": res.e2e_ms,
            "replayer.ttft_from_due_ms": res.ttft_from_due_ms,
            "replayer.e2el_from_due_ms": res.e2el_from_due_ms,
            "replayer.x_request_id": res.x_request_id,
            "replayer.tenant": res.tenant,
            "replayer.target": res.target,
            "replayer.expected_prefix_hit_tokens": res.expected_prefix_hit_tokens,
            "replayer.retries": res.retries or None,
        }
        for k, v in opt.items():
            if v is not None:
                a[k] = v
        if res.finish_reason is not None:
            a["gen_ai.response.finish_reasons"] = (res.finish_reason,)
        if res.outcome == "failed":
            a["error.type"] = res.error_kind
        return a

    def _server(self, target: str | None) -> tuple[str, int]:
        if target is None:
            return self._default_address
        got = self._addresses.get(target)
        if got is None:
            got = self._addresses[target] = _address(target)
        return got

    # -- the exporter's outcome (its thread) ------------------------------------------------------
    def _on_export(self, n: int, ok: bool) -> None:
        with self._lock:
            if self._closed:
                return  # (counted as dropped at close)
            if ok:
                self.exported += n
            else:
                self.failed += n
        if ok:
            if self._exported_counter is not None:
                self._exported_counter.inc(n)
            return
        if self._dropped_counter is not None:
            self._dropped_counter.inc(n)
        if not self._warned:
            self._warned = True
            log.warning(
                "OpenTelemetry collector at %s did not take %d spans: spans are dropped while it is down or "
                "slow, and counted (replayer_otel_spans_dropped_total); the replay goes on",
                self.url,
                n,
            )

    # -- the end ------------------------------------------------------------------------------------
    def close(self, summary: dict[str, Any] | None = None, *, timeout_s: float = CLOSE_TIMEOUT_S) -> dict[str, Any]:
        """The run span (its attributes: run id, shard and the summary's headline numbers), then
        the queue drained for at most ``timeout_s`` and the exporter shut down (blocking: call it
        off the event loop). Returns the summary's ``otel`` section: the endpoint, the spans
        handed to the exporter, exported and dropped (handed − exported: refused, timed out,
        queue full or left at the end)."""
        self._ids.next_span_id = self._run_span_id
        attrs: dict[str, Any] = {"replayer.run_id": self.ids.run_id, "replayer.shard": self._shard_text}
        if summary is not None:
            attrs.update(headline(summary))
        run_span = self._tracer.start_span(
            "replayer run",
            context=None,
            kind=self._internal,
            attributes=attrs,
            start_time=self.wall0_ns,
        )
        self.handed += 1
        run_span.end()
        # the processor drains its queue into the exporter as it shuts down; a collector that does
        # not answer would hold that for the exporter's timeout per batch: the run waits timeout_s
        closing = threading.Thread(target=self._processor.shutdown, name="otel-shutdown", daemon=True)
        closing.start()
        closing.join(timeout_s)
        with self._lock:
            self._closed = True
            exported = self.exported
            rest = self.handed - exported - self.failed
        if rest > 0 and self._dropped_counter is not None:
            self._dropped_counter.inc(rest)
        if rest > 0 and not self._warned:
            log.warning("OpenTelemetry: %d spans were not exported to %s by the end of the run", rest, self.url)
        return {
            "endpoint": self.url,
            "trace_id": self.ids.trace_id_hex,
            "sample_ratio": self.ids.ratio,
            "semconv": SEMCONV_VERSION,
            "spans_handed": self.handed,
            "spans_exported": exported,
            "spans_dropped": self.handed - exported,
        }


class _PresetIds:
    """The SDK's id generator, answering the ids replayer derived (``TraceContext``): the trace
    id of the run, and the span id set just before each span starts (on the loop's thread)."""

    def __init__(self, trace_id: int) -> None:
        self.trace_id = trace_id
        self.next_span_id = 1

    def generate_span_id(self) -> int:
        return self.next_span_id

    def generate_trace_id(self) -> int:
        return self.trace_id

    def is_trace_id_random(self) -> bool:
        return False  # (derived from the run id: the W3C "random" flag is not claimed)


class _Counting:
    """Wraps the OTLP exporter: each export's spans counted as exported or dropped."""

    def __init__(self, inner: Any, on_done: Any) -> None:
        self.inner, self.on_done = inner, on_done

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            result = self.inner.export(spans)
        except Exception:  # the exporter's own fault: the batch is lost, the replay goes on
            result = SpanExportResult.FAILURE
        self.on_done(len(spans), result == SpanExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))
