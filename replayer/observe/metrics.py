"""Every Prometheus metric replayer exports, defined here and nowhere else.

Conventions (prometheus.io/docs/practices/naming): ``replayer_`` prefix, base units (seconds,
tokens), ``_total`` counters, labels only from closed sets (``outcome`` and ``error_kind`` from
``replayer.core.errors``, ``field`` from ``USAGE_FIELDS``), explicit log-spaced histogram buckets
(mergeable across shards, unlike summaries). Everything is registered on an injected
``CollectorRegistry``; importing this module registers nothing. docs/metrics.md lists every name,
type, unit, label and meaning; a test checks that list against a live registry.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector

from replayer import __version__
from replayer.core import usage
from replayer.core.clock import now_ns
from replayer.core.endpoints import POOLING
from replayer.core.errors import ErrorKind, Outcome
from replayer.core.request import PreparedRequest
from replayer.core.result import RequestResult
from replayer.observe.metricparts import (
    LAG_BUCKETS,
    LATENCY_BUCKETS,
    LOOP_LAG_BUCKETS,
    TOKEN_LATENCY_BUCKETS,
    BulkHistogram,
    _DueCounter,
    _Flush,
    _hist_state,
    _PendingHistogram,
    _ResultsDisk,
    log_buckets,
    quantile_from_buckets,
)

#: the (outcome, error_kind) pairs that occur: success/none, not_started/none, missed_while_down/none,
#: cancelled/cancelled, cancelled/dependency, failed/every other kind
_REQUEST_LABELS = [
    (Outcome.SUCCESS, ErrorKind.NONE),
    (Outcome.NOT_STARTED, ErrorKind.NONE),
    (Outcome.MISSED_WHILE_DOWN, ErrorKind.NONE),
    (Outcome.CANCELLED, ErrorKind.CANCELLED),
    (Outcome.CANCELLED, ErrorKind.DEPENDENCY),  # (issue 47: a session turn after a failed one)
] + [(Outcome.FAILED, k) for k in ErrorKind if k not in (ErrorKind.NONE, ErrorKind.CANCELLED, ErrorKind.DEPENDENCY)]
#: closed label set of replayer_usage_mismatches_total
USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "missing")


class ReplayerMetrics:
    """The replayer's metrics on ``registry``.

    ``on_prepared``/``on_sent``/``on_result`` are the dispatcher's observer hooks (O(1) per
    request except ITL, which is one vectorised call). ``set_trace``/``set_loop`` describe the
    replay's position; ``on_expected_prefix_cache`` counts the prefix-cache hits the trace
    implies; ``snapshot()`` gives the live numbers for a console or ``/status``.
    ``process_collector=False`` skips ``process_*`` (only one may exist per registry).

    Batching: the per-request hooks (``on_prepared``, ``on_scheduled``, ``on_expected_prefix_cache``, ``on_sent``,
    ``on_dispatched``, ``on_result``) add to plain numbers under one lock (a ``Histogram.observe``
    or ``Counter.inc`` costs a lock and checks each; observe also a bucket search), and ``flush``
    moves them into the metric objects: at every collect of the registry (each scrape reads exact
    values), in ``snapshot``, and from ``on_result`` once ``FLUSH_S`` has passed since the last
    flush. Only an object read directly (not through the registry) can lag, by at most
    ``FLUSH_S`` while results arrive.
    """

    #: most seconds between flushes while results arrive
    FLUSH_S = 0.5

    def __init__(  # noqa: PLR0915
        self,
        registry: CollectorRegistry,
        *,
        config_info: dict[str, str] | None = None,
        process_collector: bool = True,
        clock=now_ns,
    ) -> None:
        r = registry
        self.registry = registry
        self._lock = threading.RLock()
        r.register(_Flush(self.flush))
        self.build_info = Info("replayer_build", "Version of replayer.", registry=r)
        self.build_info.info({"version": __version__})
        self.config_info = Info("replayer_config", "Key settings of this run (bounded set).", registry=r)
        self.config_info.info(config_info or {})
        self.scheduled = Counter("replayer_requests_scheduled", "Requests put on the schedule.", registry=r)
        self.due = _DueCounter(r, clock)
        self.results_disk = _ResultsDisk(r)
        self.sent = Counter("replayer_requests_sent", "Requests sent to the target.", registry=r)
        self.requests = Counter(
            "replayer_requests", "Requests finished, by outcome and error kind.", ["outcome", "error_kind"], registry=r
        )
        self.retries = Counter(
            "replayer_request_retries",
            "Re-sends of requests after a retryable failure "
            "(HTTP 429/5xx or a connection failure before any response byte).",
            registry=r,
        )
        self.in_flight = Gauge("replayer_requests_in_flight", "Requests sent and not yet finished.", registry=r)
        self.ttft = Histogram(
            "replayer_ttft_seconds", "Time to first token of successful requests.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "replayer_e2e_latency_seconds",
            "Send to last token of successful requests.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft_from_due = Histogram(
            "replayer_ttft_from_due_seconds",
            "Time to first token of successful requests from their due time "
            "(a held session turn's release): TTFT plus the time to the send.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e_from_due = Histogram(
            "replayer_e2e_latency_from_due_seconds",
            "Due time (a held session turn's release) to last token of successful "
            "requests: E2E latency plus the time to the send.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.slo_requests = Counter(
            "replayer_slo_requests",
            "Requests judged against the --goodput bounds, by "
            "bound (ttft, tpot, e2el; all = every bound) and result (met, missed, unknown); "
            "failed requests are missed. Only the bounds set are exported.",
            ["slo", "result"],
            registry=r,
        )
        self.tpot = Histogram(
            "replayer_tpot_seconds", "Time per output token after the first.", buckets=TOKEN_LATENCY_BUCKETS, registry=r
        )
        self.itl = BulkHistogram(
            "replayer_itl_seconds", "Inter-token latency (token-weighted).", TOKEN_LATENCY_BUCKETS, r
        )
        self.client_overhead = Histogram(
            "replayer_client_overhead_seconds",
            "Client TTFT minus the server's own queue time and TTFT (--server-timings; successful requests "
            "whose server reported both): network, the server's front end and this client.",
            buckets=TOKEN_LATENCY_BUCKETS,
            registry=r,
        )
        self.lag = Histogram(
            "replayer_dispatch_lag_seconds",
            "Dispatch time (the kernel took the request's last byte) minus due time (negative = early).",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.session_wait = Histogram(
            "replayer_session_wait_seconds",
            "Time a turn was held back for its predecessor (or parent) to end "
            "(the server's slowness; not in dispatch lag).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.pooling_audit = Counter(
            "replayer_pooling_usage_audits",
            "Pooling responses (embeddings, score, rerank) by usage audit result: ok, "
            "inflated (more prompt tokens than both expectations), missing.",
            ["endpoint", "result"],
            registry=r,
        )
        self.prompt_tokens_sent = Counter("replayer_prompt_tokens_sent", "Prompt token ids sent.", registry=r)
        self.server_prompt_tokens = Counter(
            "replayer_server_prompt_tokens", "Prompt tokens reported by the server's usage.", registry=r
        )
        self.server_completion_tokens = Counter(
            "replayer_server_completion_tokens", "Completion tokens reported by the server's usage.", registry=r
        )
        self.usage_mismatch = Counter(
            "replayer_usage_mismatches",
            "Successful requests whose server usage differs from the trace.",
            ["field"],
            registry=r,
        )
        self.otel_spans_exported = Counter(
            "replayer_otel_spans_exported", "OpenTelemetry spans the collector accepted (--otlp-endpoint).", registry=r
        )
        self.otel_spans_dropped = Counter(
            "replayer_otel_spans_dropped",
            "OpenTelemetry spans dropped: the collector refused or did not answer, or the export queue was full.",
            registry=r,
        )
        self.images_sent = Counter("replayer_images_sent", "Images sent (multimodal rows).", registry=r)
        self.image_bytes_sent = Counter(
            "replayer_image_bytes_sent", "Encoded bytes of the images sent (before base64).", registry=r
        )
        self.image_tokens = Counter(
            "replayer_image_tokens",
            "Image tokens of requests that ended: server = "
            "usage.prompt_tokens_details.image_tokens (when reported), expected = the "
            "trace's image_tokens or --image-token-rule.",
            ["source"],
            registry=r,
        )
        self.image_token_mismatches = Counter(
            "replayer_image_token_mismatches",
            "Successful requests whose server-reported image tokens differ from the expected count.",
            registry=r,
        )
        self.prefix_hit_tokens = Counter(
            "replayer_expected_prefix_cache_hit_tokens",
            "Prompt tokens the trace's hash ids say a prefix cache could serve (expected hits).",
            registry=r,
        )
        self.prefix_query_tokens = Counter(
            "replayer_expected_prefix_cache_query_tokens",
            "Prompt tokens looked up in the expected prefix cache.",
            registry=r,
        )
        self.trace_rows = Gauge("replayer_trace_rows", "Rows on the schedule per loop of the trace.", registry=r)
        self.trace_rows_done = Gauge(
            "replayer_trace_rows_done", "Rows of the current loop whose request finished (any outcome).", registry=r
        )
        self.speedup = Gauge(
            "replayer_speedup",
            "Trace seconds replayed per wall-clock second now "
            "(follows POST /speedup; replayer_config_info keeps the value at start).",
            registry=r,
        )
        self.trace_duration = Gauge(
            "replayer_trace_duration_seconds",
            "Trace time spanned by one loop's schedule (seconds of trace time; 0 when "
            "not known before the replay reads it).",
            registry=r,
        )
        self.trace_time = Gauge(
            "replayer_trace_time_seconds", "Trace time reached: trace offset of the last request sent.", registry=r
        )
        self.loop = Gauge("replayer_loop", "Current loop over the trace (0 = first pass).", registry=r)
        self.loop_lag = Histogram(
            "replayer_event_loop_lag_seconds",
            "Overshoot of the replayer's own event-loop sleeps.",
            buckets=LOOP_LAG_BUCKETS,
            registry=r,
        )
        self.loop_lag_max = Gauge(
            "replayer_event_loop_lag_max_seconds",
            "Largest event-loop sleep overshoot of the last window (about 10 s).",
            registry=r,
        )
        if process_collector:
            ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes...
        # labelled children created once (every closed-set combination is exported from the start)
        # and looked up by key per request: labels() costs several microseconds each call
        self._requests = {(o.value, k.value): self.requests.labels(o.value, k.value) for o, k in _REQUEST_LABELS}
        self._mismatch = {f: self.usage_mismatch.labels(f) for f in USAGE_FIELDS}
        self._image_tokens_server = self.image_tokens.labels("server")
        self._image_tokens_expected = self.image_tokens.labels("expected")
        self._audit = {
            (e, a): self.pooling_audit.labels(e, a) for e in sorted(POOLING) for a in ("ok", "inflated", "missing")
        }
        self._slo: dict[tuple[str, int], Counter] = {}
        self._speedup = 1.0
        self.loop_lag_recent_s = 0.0  # largest event-loop lag since its reader last reset it
        self._loop_no = 0
        self._loop_start_ns = 0
        # batched per-request updates (see the class docstring)
        (
            self._h_lag,
            self._h_ttft,
            self._h_e2e,
            self._h_ttft_due,
            self._h_e2e_due,
            self._h_tpot,
            self._h_wait,
            self._h_overhead,
        ) = (
            _PendingHistogram(h)
            for h in (
                self.lag,
                self.ttft,
                self.e2e,
                self.ttft_from_due,
                self.e2e_from_due,
                self.tpot,
                self.session_wait,
                self.client_overhead,
            )
        )
        self._hists = (
            self._h_lag,
            self._h_ttft,
            self._h_e2e,
            self._h_ttft_due,
            self._h_e2e_due,
            self._h_tpot,
            self._h_wait,
            self._h_overhead,
        )
        self._incs: dict[Any, float] = {}  # Counter/Gauge (or labelled child) -> amount to add
        self._trace_time_s: float | None = None  # Gauge value to set
        self._next_flush_s = time.monotonic() + self.FLUSH_S

    # -- batching --------------------------------------------------------------------------
    def flush(self) -> None:
        """Move the batched updates into the metric objects (any thread)."""
        with self._lock:
            self._next_flush_s = time.monotonic() + self.FLUSH_S
            for h in self._hists:
                h.flush()
            incs = self._incs
            if incs:
                for obj, n in incs.items():
                    obj.inc(n)
                incs.clear()
            if self._trace_time_s is not None:
                self.trace_time.set(self._trace_time_s)
                self._trace_time_s = None

    # -- replay position -------------------------------------------------------------------
    def set_trace(self, rows: int, duration_s: float, speedup: float = 1.0) -> None:
        """The schedule: ``rows`` per loop spanning ``duration_s`` of trace time, replayed
        ``speedup`` times faster (only used when requests carry no ``trace_ns``)."""
        self.trace_rows.set(rows)
        self.trace_duration.set(duration_s)
        self._speedup = float(speedup)
        self.speedup.set(speedup)

    def track_speedup(self, current) -> None:
        """Export ``current()`` (the timeline's speed-up, read at scrape time from the exposition
        thread: a plain attribute read) as ``replayer_speedup``."""
        self.speedup.set_function(lambda: float(current()))

    def track_due(
        self, due_ns: np.ndarray | None = None, t0_ns: int = 0, already_due: int = 0, *, count_due=None
    ) -> None:
        """Export ``replayer_requests_due_total`` either from a schedule's ``due_ns`` (offsets
        from the monotonic anchor ``t0_ns``; ``already_due`` = requests of earlier loops) or from
        ``count_due()``, a callable returning how many requests are due by now (called at scrape
        time, from the exposition thread: it must only read plain attributes)."""
        self.due.track(due_ns, t0_ns, already_due, count_due=count_due)

    def set_loop(self, loop: int, start_trace_ns: int = 0) -> None:
        """Loop ``loop`` (0-based) starts at trace offset ``start_trace_ns`` (loop offset included,
        as in ``PreparedRequest.trace_ns``). ``on_sent`` calls it by itself when a request of a
        later loop goes out, so calling it is optional."""
        with self._lock:
            self.flush()  # the rows done so far belong to the previous loop
            self._loop_no, self._loop_start_ns = int(loop), int(start_trace_ns)
            self.loop.set(loop)
            self.trace_rows_done.set(0)

    def on_expected_prefix_cache(self, query_tokens: int, hit_tokens: int) -> None:
        """One request's prompt: ``query_tokens`` looked up, ``hit_tokens`` of them expected cached."""
        with self._lock:
            incs = self._incs
            c = self.prefix_query_tokens
            incs[c] = incs.get(c, 0) + query_tokens
            if hit_tokens:
                c = self.prefix_hit_tokens
                incs[c] = incs.get(c, 0) + hit_tokens

    def set_slos(self, slos: dict[str, float]) -> None:
        """Export ``replayer_slo_requests_total`` for the ``--goodput`` bounds ``slos`` (and ``all``),
        every result from the start (a rate over a missing series is no rate); no bounds, no series."""
        from replayer.core.slo import RESULT_LABELS

        self._slo = {
            (name, code): self.slo_requests.labels(name, label)
            for name in (*slos, "all")
            if slos
            for code, label in RESULT_LABELS.items()
        }

    def on_slo(self, codes: dict[str, int]) -> None:
        """One request's verdict codes (``replayer.core.slo.judge_one``); not-judged ones are not counted."""
        for key in codes.items():
            child = self._slo.get(key)
            if child is not None:
                child.inc()

    def on_event_loop_lag(self, lag_s: float) -> None:
        self.loop_lag.observe(lag_s)
        if lag_s > self.loop_lag_recent_s:
            self.loop_lag_recent_s = lag_s

    # -- observer hooks --------------------------------------------------------------------
    def on_scheduled(self, n: int) -> None:
        with self._lock:
            c = self.scheduled
            self._incs[c] = self._incs.get(c, 0) + n

    def on_prepared(self, req: PreparedRequest) -> None:
        """A request was put on the schedule (built in the lead window): ``on_scheduled(1)`` and,
        when it has expected hits, ``on_expected_prefix_cache`` (its input tokens, those hits)."""
        with self._lock:
            incs = self._incs
            get = incs.get
            c = self.scheduled
            incs[c] = get(c, 0) + 1
            hits = req.expected_hits
            if hits is not None:
                c = self.prefix_query_tokens
                incs[c] = get(c, 0) + req.input_length
                if hits:
                    c = self.prefix_hit_tokens
                    incs[c] = get(c, 0) + hits

    def on_sent(self, req: PreparedRequest) -> None:
        c: Any  # each Counter or Gauge (or labelled child) in turn
        with self._lock:
            incs = self._incs
            get = incs.get
            c = self.sent
            incs[c] = get(c, 0) + 1
            c = self.in_flight
            incs[c] = get(c, 0) + 1
            c = self.prompt_tokens_sent
            incs[c] = get(c, 0) + req.prompt_len
            trace_ns: int = req.trace_pos_ns or req.trace_ns  # the trace's own time
            if req.loop > self._loop_no:  # the first request of a new loop: follow it
                self.set_loop(req.loop, start_trace_ns=trace_ns)
            if req.loop == self._loop_no:
                if trace_ns:
                    self._trace_time_s = max(0, trace_ns - self._loop_start_ns) / 1e9
                else:  # no trace time on the request: derive it from the due time
                    self._trace_time_s = max(0, req.due_ns) * self._speedup / 1e9

    def on_dispatched(self, res: RequestResult) -> None:
        """A request went out (its ``dispatch_lag_ms`` is set): observed at send time, so the
        lag histogram and alerts on it do not wait for the response to end."""
        with self._lock:
            self._h_lag.add(res.dispatch_lag_ms / 1e3)  # type: ignore[operator]

    def on_result(self, res: RequestResult) -> None:
        c: Any
        with self._lock:
            incs = self._incs
            get = incs.get
            c = self._requests.get((res.outcome, res.error_kind)) or self.requests.labels(res.outcome, res.error_kind)
            incs[c] = get(c, 0) + 1
            if res.retries:
                c = self.retries
                incs[c] = get(c, 0) + res.retries
            if res.loop == self._loop_no:
                c = self.trace_rows_done
                incs[c] = get(c, 0) + 1
            if res.outcome not in ("not_started", "missed_while_down"):  # never issued: never in flight
                self._issued(res, incs, get)
            if time.monotonic() >= self._next_flush_s:
                self.flush()

    def _issued(self, res: RequestResult, incs: dict, get) -> None:  # noqa: C901, PLR0912
        c: Any
        c = self.in_flight
        incs[c] = get(c, 0) - 1
        if res.session_wait_ms is not None:
            self._h_wait.add(res.session_wait_ms / 1e3)
        if res.usage_audit != "n/a":
            audit = self._audit.get((res.endpoint, res.usage_audit))
            if audit is not None:
                incs[audit] = get(audit, 0) + 1
        if res.prompt_tokens is not None:
            c = self.server_prompt_tokens
            incs[c] = get(c, 0) + res.prompt_tokens
        if res.images:
            self._images(res, incs, get)
        if res.completion_tokens is not None:
            c = self.server_completion_tokens
            incs[c] = get(c, 0) + res.completion_tokens
        if res.outcome != "success":
            return
        if res.ttft_ms is not None:
            self._h_ttft.add(res.ttft_ms / 1e3)
        if res.e2e_ms is not None:
            self._h_e2e.add(res.e2e_ms / 1e3)
        if res.ttft_from_due_ms is not None:
            self._h_ttft_due.add(res.ttft_from_due_ms / 1e3)
        if res.e2el_from_due_ms is not None:
            self._h_e2e_due.add(res.e2el_from_due_ms / 1e3)
        if res.tpot_ms is not None:
            self._h_tpot.add(res.tpot_ms / 1e3)
        if res.client_overhead_ms is not None:
            self._h_overhead.add(res.client_overhead_ms / 1e3)
        if res.itl_ms:
            self.itl.observe_many(np.asarray(res.itl_ms) / 1e3)
        if res.endpoint in POOLING:
            return  # audited against its own expectations (replayer.http.audit)
        found = usage.of_request(
            res.prompt_tokens,
            res.completion_tokens,
            res.input_length,
            res.output_length,
            images=res.images,
            text_tokens=res.text_tokens,
        )
        mismatch = self._mismatch
        for field, hit in (
            ("missing", found.missing),
            ("prompt_tokens", found.prompt),
            ("completion_tokens", found.completion),
        ):
            if hit:
                c = mismatch[field]
                incs[c] = get(c, 0) + 1

    def _images(self, res: RequestResult, incs: dict, get) -> None:
        for c, n in (
            (self.images_sent, res.images),
            (self.image_bytes_sent, res.image_bytes),
            (self._image_tokens_server, res.image_tokens),
            (self._image_tokens_expected, res.expected_image_tokens),
        ):
            if n is not None:
                incs[c] = get(c, 0) + n
        if (
            res.outcome == "success"
            and res.image_tokens is not None
            and res.expected_image_tokens is not None
            and res.image_tokens != res.expected_image_tokens
        ):
            c = self.image_token_mismatches
            incs[c] = get(c, 0) + 1

    # -- live view -------------------------------------------------------------------------
    def snapshot(self) -> dict[str, float | int | str | None]:
        """Live numbers since start (JSON-ready; ``None`` = nothing measured yet): cumulative
        quantiles in seconds from the histograms, token counters, trace position. A few dozen
        samples are read: cheap enough for a 2 Hz console."""
        self.flush()
        out: dict[str, float | int | str | None] = {}
        for name, h, seen, qs in (
            ("ttft", self.ttft, self._h_ttft, (0.5, 0.99)),
            ("dispatch_lag", self.lag, self._h_lag, (0.5, 0.99)),
            ("e2e", self.e2e, self._h_e2e, (0.5, 0.99)),
            ("itl", self.itl, self.itl, (0.5, 0.99)),
        ):
            bounds, cum = _hist_state(h)
            for q in qs:  # an estimate, clamped to the exact [min, max] observed (LIVE_PERCENTILES)
                out[f"{name}_p{int(q * 100)}_s"] = quantile_from_buckets(q, bounds, cum, lo=seen.min, hi=seen.max)
        out["percentile_method"] = LIVE_PERCENTILES
        out["due"] = self.due.value()
        out["prompt_tokens_total"] = int(self.server_prompt_tokens._value.get())  # noqa: SLF001
        out["completion_tokens_total"] = int(self.server_completion_tokens._value.get())  # noqa: SLF001
        out["trace_rows"] = int(self.trace_rows._value.get())  # noqa: SLF001
        out["trace_rows_done"] = int(self.trace_rows_done._value.get())  # noqa: SLF001
        out["trace_time_s"] = self.trace_time._value.get()  # noqa: SLF001
        out["trace_duration_s"] = self.trace_duration._value.get()  # noqa: SLF001
        out["loop"] = self._loop_no
        out["event_loop_lag_max_s"] = self.loop_lag_max._value.get()  # noqa: SLF001
        return out


#: how the live quantiles of ``snapshot`` (``/status``, the console) are made: estimates
LIVE_PERCENTILES = (
    "estimate: interpolated in the Prometheus histogram's bucket, clamped to the exact min and max observed"
)


def metric_names(registry: CollectorRegistry) -> list[str]:
    """Family names on ``registry`` as exposed (counters with ``_total``, info with ``_info``)."""
    names = []
    for fam in registry.collect():
        if fam.type == "counter":
            names.append(fam.name + "_total")
        elif fam.type == "info":
            names.append(fam.name + "_info")
        else:
            names.append(fam.name)
    return sorted(set(names))


__all__ = [
    "BulkHistogram",
    "ReplayerMetrics",
    "LATENCY_BUCKETS",
    "TOKEN_LATENCY_BUCKETS",
    "LAG_BUCKETS",
    "LOOP_LAG_BUCKETS",
    "log_buckets",
    "metric_names",
    "quantile_from_buckets",
]
