"""Request and latency series by one bounded label: a mixed run's ``tenant``, a run's ``target``.

The label's values are a closed set fixed before the run (the mix's tenants, the ``--target``
URLs), so every child is created up front and the label stays bounded. Each result is counted by
its own value of the label (a result without one, or with a value outside the set, is left out):
``replayer_<label>_requests_total{<label>,outcome}``, ``replayer_<label>_ttft_seconds`` and
``replayer_<label>_e2e_latency_seconds`` (successful requests only, as the run-wide histograms;
explicit log-spaced buckets), and with ``session_wait`` also
``replayer_<label>_session_wait_seconds`` (every turn the session gate held).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from replayer.core.errors import Outcome
from replayer.core.result import RequestResult
from replayer.observe.histograms import log_buckets

_LATENCY = log_buckets(0.001, 600.0)


class GroupMetrics:
    """The series of one label (module docstring). ``label`` is also the ``RequestResult`` field
    read; ``what`` names the label's values in the requests counter's help text."""

    def __init__(
        self, registry: CollectorRegistry, label: str, values: list[str], what: str, *, session_wait: bool = False
    ) -> None:
        self.label = label
        self.values = frozenset(values)
        self.requests = Counter(
            f"replayer_{label}_requests_total",
            f"Requests that ended, by {what} and outcome",
            [label, "outcome"],
            registry=registry,
        )
        self.ttft = Histogram(
            f"replayer_{label}_ttft_seconds",
            f"Time to first token by {label}",
            [label],
            buckets=_LATENCY,
            registry=registry,
        )
        self.e2e = Histogram(
            f"replayer_{label}_e2e_latency_seconds",
            f"End-to-end latency by {label}",
            [label],
            buckets=_LATENCY,
            registry=registry,
        )
        self.wait = (
            Histogram(
                f"replayer_{label}_session_wait_seconds",
                f"Time a session turn was held for its predecessor, by {label}",
                [label],
                buckets=_LATENCY,
                registry=registry,
            )
            if session_wait
            else None
        )
        for v in values:
            for o in Outcome:
                self.requests.labels(v, o.value)
            self.ttft.labels(v)
            self.e2e.labels(v)
            if self.wait is not None:
                self.wait.labels(v)

    def on_result(self, res: RequestResult) -> None:
        v = getattr(res, self.label)
        if v not in self.values:
            return
        outcome = Outcome(res.outcome)
        self.requests.labels(v, outcome.value).inc()
        if self.wait is not None and res.session_wait_ms is not None:
            self.wait.labels(v).observe(res.session_wait_ms / 1e3)
        if outcome is not Outcome.SUCCESS:  # latency histograms hold successful requests only
            return
        if res.ttft_ms is not None:
            self.ttft.labels(v).observe(res.ttft_ms / 1e3)
        if res.e2e_ms is not None:
            self.e2e.labels(v).observe(res.e2e_ms / 1e3)
