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
from replayer.observe.events import RunEvents
from replayer.observe.histograms import (
    LAG_BUCKETS,
    LATENCY_BUCKETS,
    LOOP_LAG_BUCKETS,
    TOKEN_LATENCY_BUCKETS,
    BatchedHistogram,
    log_buckets,
)
from replayer.observe.livewindow import LiveWindow
from replayer.observe.metricparts import _DueCounter, _Flush, _ResultsDisk, quantile_from_buckets
from replayer.observe.metrictable import declare

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

    # the rows of metrictable.METRICS (made by declare in __init__)
    build_info: Info
    config_info: Info
    scheduled: Counter
    sent: Counter
    requests: Counter
    retries: Counter
    in_flight: Gauge
    ttft: BatchedHistogram
    e2e: BatchedHistogram
    ttft_from_due: BatchedHistogram
    e2e_from_due: BatchedHistogram
    slo_requests: Counter
    tpot: BatchedHistogram
    itl: BatchedHistogram
    client_overhead: BatchedHistogram
    lag: BatchedHistogram
    session_wait: BatchedHistogram
    pooling_audit: Counter
    prompt_tokens_sent: Counter
    server_prompt_tokens: Counter
    server_completion_tokens: Counter
    usage_mismatch: Counter
    otel_spans_exported: Counter
    otel_spans_dropped: Counter
    images_sent: Counter
    image_bytes_sent: Counter
    image_tokens: Counter
    image_token_mismatches: Counter
    prefix_hit_tokens: Counter
    prefix_query_tokens: Counter
    trace_rows: Gauge
    trace_rows_done: Gauge
    speedup: Gauge
    trace_duration: Gauge
    trace_time: Gauge
    loop: Gauge
    loop_lag: Histogram
    loop_lag_max: Gauge

    #: most seconds between flushes while results arrive
    FLUSH_S = 0.5

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        config_info: dict[str, str] | None = None,
        process_collector: bool = True,
        clock=now_ns,
        window_s: float = 60.0,
    ) -> None:
        r = registry
        self.registry = registry
        self._lock = threading.RLock()
        r.register(_Flush(self.flush))
        made = declare(r, self._lock)  # every row of metrictable.METRICS, as an attribute
        for attr, obj in made.items():
            setattr(self, attr, obj)
        self.build_info.info({"version": __version__})
        self.config_info.info(config_info or {})
        self.due = _DueCounter(r, clock)
        self.results_disk = _ResultsDisk(r)
        self._hists = tuple(v for v in made.values() if isinstance(v, BatchedHistogram))
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
        self._incs: dict[Any, float] = {}  # Counter/Gauge (or labelled child) -> amount to add
        self._trace_time_s: float | None = None  # Gauge value to set
        self._next_flush_s = time.monotonic() + self.FLUSH_S
        self.events = RunEvents(r)  # what happened when (summary.json's events, the annotations)
        self.live_window = LiveWindow(r, window_s)  # fed by the fan-out (its "live window" step)

    # -- batching --------------------------------------------------------------------------
    def flush(self) -> None:
        """Move the batched updates into the metric objects (any thread)."""
        with self._lock:
            self._next_flush_s = time.monotonic() + self.FLUSH_S
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
            if loop > self._loop_no:
                self.events.record("loop", loop=int(loop))
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
            self.lag.add(res.dispatch_lag_ms / 1e3)  # type: ignore[operator]

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
            self.session_wait.add(res.session_wait_ms / 1e3)
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
            self.ttft.add(res.ttft_ms / 1e3)
        if res.e2e_ms is not None:
            self.e2e.add(res.e2e_ms / 1e3)
        if res.ttft_from_due_ms is not None:
            self.ttft_from_due.add(res.ttft_from_due_ms / 1e3)
        if res.e2el_from_due_ms is not None:
            self.e2e_from_due.add(res.e2el_from_due_ms / 1e3)
        if res.tpot_ms is not None:
            self.tpot.add(res.tpot_ms / 1e3)
        if res.client_overhead_ms is not None:
            self.client_overhead.add(res.client_overhead_ms / 1e3)
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
        for name, h in (("ttft", self.ttft), ("dispatch_lag", self.lag), ("e2e", self.e2e), ("itl", self.itl)):
            bounds, cum = h.cumulative()
            for q in (0.5, 0.99):  # an estimate, clamped to the exact [min, max] observed (LIVE_PERCENTILES)
                out[f"{name}_p{int(q * 100)}_s"] = quantile_from_buckets(q, bounds, cum, lo=h.min, hi=h.max)
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
    "BatchedHistogram",
    "ReplayerMetrics",
    "LATENCY_BUCKETS",
    "TOKEN_LATENCY_BUCKETS",
    "LAG_BUCKETS",
    "LOOP_LAG_BUCKETS",
    "log_buckets",
    "metric_names",
    "quantile_from_buckets",
]
