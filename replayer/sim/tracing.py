"""The simulator's OpenTelemetry spans (``replayer sim --otlp-endpoint``): one SERVER span
``llm_request`` per completions/chat request, as vLLM started with ``--otlp-traces-endpoint``
emits it, parented by the request's W3C ``traceparent`` (a sampled-out parent: no span).

Attribute names are vLLM's (``vllm/tracing.py``, set by its output processor): the latencies
in seconds from the simulator's own model of time: ``gen_ai.latency.time_in_queue`` (admission
wait), ``time_to_first_token`` (arrival to first token, the queue included, as vLLM measures it),
``time_in_model_prefill`` (scheduled to first token), ``time_in_model_decode`` (first to last
token), ``time_in_model_inference`` (scheduled to last token), ``e2e`` (arrival to last token);
with ``gen_ai.usage.prompt_tokens``, ``gen_ai.usage.completion_tokens``,
``gen_ai.request.max_tokens``, ``gen_ai.response.model`` and ``gen_ai.request.id``. The SDK is
imported only when the simulator was given an endpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from replayer.core.tracecontext import parse_traceparent

__all__ = ["SimSpans"]


class SimSpans:
    """The simulator's span exporter (OTLP/HTTP to ``url``; ``/v1/traces`` added to a base URL)."""

    def __init__(self, url: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, set_span_in_context

        logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)  # a down collector: spans lost, quietly
        base = url.rstrip("/")
        self.url = base if base.endswith("/v1/traces") else base + "/v1/traces"
        self._processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=self.url))
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": "replayer-sim"}), shutdown_on_exit=False
        )
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer("replayer.sim")
        self._server = SpanKind.SERVER
        self._remote = (NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context)
        # perf_counter seconds -> Unix ns (the spans' clock), taken once
        self._offset_ns = time.time_ns() - time.perf_counter_ns()

    def wall_ns(self, perf_s: float) -> int:
        return self._offset_ns + int(perf_s * 1e9)

    def emit(
        self,
        traceparent: str | None,
        *,
        request_id: str,
        model: str,
        arrival_s: float,
        queued_s: float,
        scheduled_s: float,
        first_s: float | None,
        last_s: float,
        prompt_tokens: int,
        completion_tokens: int | None,
        max_tokens: int,
    ) -> None:
        """One request's ``llm_request`` span (times: ``time.perf_counter()`` seconds)."""
        nonrec, ctx_cls, flags_cls, in_context = self._remote
        parent = parse_traceparent(traceparent)
        context = None
        if parent is not None:
            trace_id, span_id, sampled = parent
            if not sampled:
                return
            context = in_context(nonrec(ctx_cls(trace_id, span_id, is_remote=True, trace_flags=flags_cls(1))))
        attrs: dict[str, Any] = {
            "gen_ai.response.model": model,
            "gen_ai.request.id": request_id,
            "gen_ai.request.max_tokens": max_tokens,
            "gen_ai.usage.prompt_tokens": prompt_tokens,
            "gen_ai.latency.time_in_queue": scheduled_s - queued_s,
            "gen_ai.latency.e2e": last_s - arrival_s,
        }
        if completion_tokens is not None:
            attrs["gen_ai.usage.completion_tokens"] = completion_tokens
        if first_s is not None:
            attrs["gen_ai.latency.time_to_first_token"] = first_s - arrival_s
            attrs["gen_ai.latency.time_in_model_prefill"] = first_s - scheduled_s
            attrs["gen_ai.latency.time_in_model_decode"] = last_s - first_s
        attrs["gen_ai.latency.time_in_model_inference"] = last_s - scheduled_s
        span = self._tracer.start_span(
            "llm_request", context=context, kind=self._server, attributes=attrs, start_time=self.wall_ns(arrival_s)
        )
        span.end(end_time=self.wall_ns(last_s))

    def close(self, timeout_s: float = 5.0) -> None:
        """Export what is queued and stop the exporter, waiting at most ``timeout_s`` (a collector
        that does not answer holds the export for its timeout: the rest is lost)."""
        closing = threading.Thread(target=self._processor.shutdown, name="otel-shutdown", daemon=True)
        closing.start()
        closing.join(timeout_s)
