"""Every Prometheus metric replayer exports, defined here and nowhere else.

Conventions (prometheus.io/docs/practices/naming): ``replayer_`` prefix, base units (seconds,
tokens), ``_total`` counters, labels only from closed sets (``outcome`` and ``error_kind`` from
``replayer.errors``), explicit log-spaced histogram buckets (mergeable across shards, unlike
summaries). Everything is registered on an injected ``CollectorRegistry``; importing this module
registers nothing. See docs/metrics.md for the table of names, types, units and meanings.
"""

from __future__ import annotations

import threading

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from . import __version__
from .errors import ErrorKind, Outcome
from .payload import PreparedRequest
from .result import RequestResult


def log_buckets(lo: float, hi: float, per_decade: int = 5) -> tuple[float, ...]:
    """Log-spaced bucket bounds from ``lo`` to at least ``hi``, ``per_decade`` per factor 10,
    rounded to 3 significant digits."""
    n = int(np.ceil(np.log10(hi / lo) * per_decade)) + 1
    return tuple(float(f"{lo * 10 ** (i / per_decade):.3g}") for i in range(n))


#: request latencies (TTFT, E2E): 1 ms .. ~17 min
LATENCY_BUCKETS = log_buckets(0.001, 1000.0)
#: per-token latencies (ITL, TPOT): 0.1 ms .. 10 s
TOKEN_LATENCY_BUCKETS = log_buckets(0.0001, 10.0)
#: dispatch lag is signed (early < 0 < late): mirrored log buckets, 10 us .. 100 s
_LAG = log_buckets(0.00001, 100.0, per_decade=3)
LAG_BUCKETS = tuple(-b for b in reversed(_LAG[:7])) + (0.0,) + _LAG


class BulkHistogram(Collector):
    """A label-less Prometheus histogram that takes many observations in one numpy call.

    Used for ITL, where a request yields hundreds of samples at once: ``observe_many`` costs one
    ``searchsorted`` instead of one locked ``observe`` per token. Exposed as a normal histogram.
    """

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...],
                 registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self._bounds = np.asarray(buckets, dtype=np.float64)
        self._counts = np.zeros(len(buckets) + 1, dtype=np.int64)  # last = +Inf
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values: np.ndarray | list[float]) -> None:
        v = np.asarray(values, dtype=np.float64)
        if v.size == 0:
            return
        idx = np.searchsorted(self._bounds, v, side="left")  # bucket i counts v <= bounds[i]
        add = np.bincount(idx, minlength=self._counts.size)
        with self._lock:
            self._counts += add
            self._sum += float(v.sum())

    def collect(self):
        with self._lock:
            cum = np.cumsum(self._counts)
            total = self._sum
        buckets = [(repr(float(b)), int(c)) for b, c in zip(self._bounds, cum[:-1])]
        buckets.append(("+Inf", int(cum[-1])))
        fam = HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=total)
        yield fam

    def describe(self):
        return [HistogramMetricFamily(self.name, self.documentation)]


class ReplayerMetrics:
    """The replayer's metrics on ``registry``; ``on_sent``/``on_result`` are the dispatcher's
    observer hooks (O(1) per request except ITL, which is one vectorised call)."""

    def __init__(self, registry: CollectorRegistry, *, config_info: dict[str, str] | None = None) -> None:
        r = registry
        self.build_info = Info("replayer_build", "Version of replayer.", registry=r)
        self.build_info.info({"version": __version__})
        self.config_info = Info("replayer_config", "Key settings of this run (bounded set).", registry=r)
        self.config_info.info(config_info or {})
        self.scheduled = Counter("replayer_requests_scheduled", "Requests put on the schedule.", registry=r)
        self.sent = Counter("replayer_requests_sent", "Requests sent to the target.", registry=r)
        self.requests = Counter("replayer_requests", "Requests finished, by outcome and error kind.",
                                ["outcome", "error_kind"], registry=r)
        self.in_flight = Gauge("replayer_requests_in_flight", "Requests sent and not yet finished.", registry=r)
        self.ttft = Histogram("replayer_ttft_seconds", "Time to first token of successful requests.",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("replayer_e2e_latency_seconds",
                             "Send to last token of successful requests.", buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("replayer_tpot_seconds", "Time per output token after the first.",
                              buckets=TOKEN_LATENCY_BUCKETS, registry=r)
        self.itl = BulkHistogram("replayer_itl_seconds", "Inter-token latency (token-weighted).",
                                 TOKEN_LATENCY_BUCKETS, r)
        self.lag = Histogram("replayer_dispatch_lag_seconds",
                             "Actual send time minus due time (negative = early).", buckets=LAG_BUCKETS, registry=r)
        self.prompt_tokens_sent = Counter("replayer_prompt_tokens_sent", "Prompt token ids sent.", registry=r)
        self.server_prompt_tokens = Counter("replayer_server_prompt_tokens",
                                            "Prompt tokens reported by the server's usage.", registry=r)
        self.server_completion_tokens = Counter("replayer_server_completion_tokens",
                                                "Completion tokens reported by the server's usage.", registry=r)
        self.usage_mismatch = Counter("replayer_usage_mismatches",
                                      "Successful requests whose server usage differs from the trace.",
                                      ["field"], registry=r)
        for outcome in Outcome:
            for kind in ErrorKind:
                if (outcome is Outcome.SUCCESS) == (kind is ErrorKind.NONE):
                    self.requests.labels(outcome.value, kind.value)
        for field in ("prompt_tokens", "completion_tokens", "missing"):
            self.usage_mismatch.labels(field)

    def on_scheduled(self, n: int) -> None:
        self.scheduled.inc(n)

    def on_sent(self, req: PreparedRequest) -> None:
        self.sent.inc()
        self.in_flight.inc()
        self.prompt_tokens_sent.inc(req.prompt_len)

    def on_result(self, res: RequestResult) -> None:
        self.requests.labels(res.outcome, res.error_kind).inc()
        if res.sent_ns is None:
            return  # not started: never counted as in flight
        self.in_flight.dec()
        if res.dispatch_lag_ms is not None:
            self.lag.observe(res.dispatch_lag_ms / 1e3)
        if res.prompt_tokens is not None:
            self.server_prompt_tokens.inc(res.prompt_tokens)
        if res.completion_tokens is not None:
            self.server_completion_tokens.inc(res.completion_tokens)
        if res.outcome != "success":
            return
        if res.ttft_ms is not None:
            self.ttft.observe(res.ttft_ms / 1e3)
        if res.e2e_ms is not None:
            self.e2e.observe(res.e2e_ms / 1e3)
        if res.tpot_ms is not None:
            self.tpot.observe(res.tpot_ms / 1e3)
        if res.itl_ms:
            self.itl.observe_many(np.asarray(res.itl_ms) / 1e3)
        if res.prompt_tokens is None:
            self.usage_mismatch.labels("missing").inc()
        elif res.prompt_tokens != res.input_length:
            self.usage_mismatch.labels("prompt_tokens").inc()
        if res.completion_tokens is not None and res.completion_tokens != res.output_length:
            self.usage_mismatch.labels("completion_tokens").inc()
