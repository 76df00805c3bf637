"""The one path a result takes after the client: an ordered fan-out that the run builds.

A result leaves the client once (the dispatcher hands it to its ``sink``) and goes through these
steps in this order, each once:

1. ``verdict``: judged against the ``--goodput`` bounds (``slo_met`` set; its codes counted);
2. ``metrics``: the run's Prometheus histograms and counters (then ``live window``: the exact
   quantiles of the last minute, ``replayer.observe.livewindow``);
3. ``tenants`` / ``targets``: the per-trace and per-target series of a mix or a routed fleet;
4. ``live state``: the counters of ``/status``, the progress line and the error-burst log;
5. ``spans``: with ``--otlp-endpoint``, the request's OpenTelemetry span (``replayer.observe.otel``);
   ``self-checks``: a stream that arrived all at once (``replayer.observe.streamcheck``);
6. ``verdicts``: the live fidelity figures and drift windows (``replayer.results.verdictwatch``);
7. ``recorder``: the results file (last: a result on disk has been counted everywhere).

The latencies (from the send and from the due time) were derived once, as the client measured
the request (``replayer.core.timestamps.derive``); no step computes them again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from replayer.core.result import RequestResult
from replayer.core.slo import judge_result

Step = tuple[str, Callable[[RequestResult], None]]


class _Counts(Protocol):
    def on_slo(self, codes: dict[str, int]) -> None: ...
    def on_result(self, res: RequestResult) -> None: ...


class _OnResult(Protocol):
    def on_result(self, res: RequestResult) -> None: ...


class _Adds(Protocol):
    def add(self, res: RequestResult) -> None: ...


class ResultFanout:
    """Calls each step on every result, in order (``names`` lists them). A step that raises stops
    the result there; the dispatcher logs it and the replay goes on."""

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = tuple(steps)
        self._calls = tuple(call for _, call in self.steps)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.steps)

    def __call__(self, res: RequestResult) -> None:
        for call in self._calls:
            call(res)


def result_fanout(
    *,
    slos: dict[str, float],
    metrics: _Counts,
    live: _OnResult,
    recorder: _Adds,
    tenants: _OnResult | None = None,
    targets: _OnResult | None = None,
    spans: _OnResult | None = None,
    live_window: _OnResult | None = None,
    verdicts: _OnResult | None = None,
    checks: _OnResult | None = None,
) -> ResultFanout:
    """The run's fan-out (module docstring): ``verdict`` only with bounds, ``tenants`` with a mix,
    ``targets`` with several targets, ``spans`` with tracing on, ``live window`` and ``verdicts`` when given."""
    steps: list[Step] = []
    if slos:

        def verdict(res: RequestResult) -> None:
            codes = judge_result(res, slos)
            if codes is not None:
                metrics.on_slo(codes)

        steps.append(("verdict", verdict))
    steps.append(("metrics", metrics.on_result))
    if live_window is not None:
        steps.append(("live window", live_window.on_result))
    if tenants is not None:
        steps.append(("tenants", tenants.on_result))
    if targets is not None:
        steps.append(("targets", targets.on_result))
    steps.append(("live state", live.on_result))
    if spans is not None:
        steps.append(("spans", spans.on_result))
    if verdicts is not None:
        steps.append(("verdicts", verdicts.on_result))
    if checks is not None:  # (issue 47) self-checks that see every result: streams buffered on the way
        steps.append(("self-checks", checks.on_result))
    steps.append(("recorder", recorder.add))
    return ResultFanout(steps)
