"""The run's one implementation of the request event stream (``replayer.core.events``): each event
handed to its subscribers in a stated order; and the subscribers that are the run's own (the
warm-up marker, the verdict, the live state).

The stages tell of each request through the stream they were built with: the request factory
(``prepared``), the dispatcher (``sent``, ``finished``) and the client (``dispatched``); none calls
back into the run any other way. A subscriber is an object with any of ``on_prepared(req)``,
``on_sent(req)``, ``on_dispatched(res)``, ``on_result(res)``; it gets the events it has a method
for. The run's subscribers, in this order (``result_fanout``), each event once:

1. ``warm-up``: with ``--warmup-requests``/``--warmup-seconds``, marks a request warm-up as it is
   dispatched (before anything counts it), then ``warm-up end`` records the run's event at the
   first request dispatched that is not warm-up (``replayer.observe.events``);
2. ``verdict``: with ``--goodput`` bounds, judges each result (``slo_met`` set; its codes counted);
3. ``metrics``: the run's Prometheus series (every event), then ``live window``: the exact
   quantiles of the last minute (``replayer.observe.livewindow``);
4. ``tenants`` / ``targets``: the per-trace and per-target series of a mix or a routed fleet;
5. ``live state``: the counters of ``/status``, the progress line and the error-burst log;
6. ``spans``: with ``--otlp-endpoint``, the request's OpenTelemetry span (``replayer.observe.otel``);
   then ``verdicts``: the live fidelity figures and drift windows (``replayer.results.verdictwatch``),
   and ``self-checks``: a stream that arrived all at once (``replayer.observe.streamcheck``);
7. ``recorder``: the results file (last: a result on disk has been counted everywhere).

The latencies (from the send and from the due time) were derived once, as the client measured
the request (``replayer.core.timestamps.derive``); no subscriber computes them again.

The stream is built before the parts that tell it (``EventStream()``: every event dropped) and its
subscribers attached once, before the first request is prepared (``subscribe``: the recorder's
file and the spans' exporter exist only then). Each event is then one attribute read and one call
of a function fixed at ``subscribe``: the subscribers' bound methods themselves when there is one,
no loop over a list when there are two.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any, Protocol

from replayer.core.request import PreparedRequest
from replayer.core.result import RequestResult
from replayer.core.slo import judge_result
from replayer.observe.logs import ErrorBurstLog
from replayer.run.live import RunState

#: a subscriber and its name (``EventStream.names``)
Step = tuple[str, object]
#: each event and the subscriber method that receives it
HOOKS: tuple[tuple[str, str], ...] = (
    ("prepared", "on_prepared"),
    ("sent", "on_sent"),
    ("dispatched", "on_dispatched"),
    ("finished", "on_result"),
)

__all__ = ["HOOKS", "Accounting", "EventStream", "Step", "Verdict", "WarmupEnd", "WarmupMarker", "result_fanout"]


def _drop(_: Any) -> None:
    pass


def _chain(calls: Sequence[Callable[[Any], None]]) -> Callable[[Any], None]:
    """One callable that calls ``calls`` in order: none, one (itself), two, or more."""
    if not calls:
        return _drop
    if len(calls) == 1:
        return calls[0]
    if len(calls) == 2:
        first, second = calls

        def both(x: Any) -> None:
            first(x)
            second(x)

        return both
    every = tuple(calls)

    def each(x: Any) -> None:
        for call in every:
            call(x)

    return each


class EventStream:
    """The run's ``RequestEvents``: each event called on the subscribers that have its hook, in
    their order. A subscriber that raises stops the event there (the dispatcher logs a
    ``finished`` that raised and the replay goes on)."""

    prepared: Callable[[PreparedRequest], None]
    sent: Callable[[PreparedRequest], None]
    dispatched: Callable[[RequestResult], None]
    finished: Callable[[RequestResult], None]

    def __init__(self, steps: Sequence[Step] = ()) -> None:
        self.steps: tuple[Step, ...] = ()
        self.subscribe(steps)

    def subscribe(self, steps: Sequence[Step]) -> None:
        """The subscribers, in order (replacing any before): each event's calls fixed now."""
        self.steps = tuple(steps)
        for event, hook in HOOKS:
            setattr(self, event, _chain([getattr(s, hook) for _, s in self.steps if hasattr(s, hook)]))

    def names(self, event: str = "finished") -> tuple[str, ...]:
        """The subscribers of ``event``, in the order they get it."""
        hook = dict(HOOKS)[event]
        return tuple(name for name, s in self.steps if hasattr(s, hook))


class Accounting:
    """The ``live state`` subscriber of the run's event stream (``replayer.run.fanout``): the
    counters of ``/status`` and the progress line as requests go out (``on_sent``), the dispatch
    lag's maxima (``on_dispatched``), each result's outcome and the error-burst log
    (``on_result``)."""

    def __init__(self, state: RunState) -> None:
        self.s = state
        self.bursts = ErrorBurstLog()  # failures logged per error kind, at most one line per 10 s

    def on_sent(self, req: PreparedRequest) -> None:
        self.s.sent += 1

    def on_result(self, res: RequestResult) -> None:
        s = self.s
        o = res.outcome
        if o == "success":
            s.completed += 1
        elif o == "failed":
            s.failed += 1
            self.bursts.observe(res)
        elif o == "cancelled":
            s.cancelled += 1
        elif o == "missed_while_down":
            s.missed_while_down += 1
        else:
            s.not_started += 1

    def on_dispatched(self, res: RequestResult) -> None:
        s, lag = self.s, res.dispatch_lag_ms
        if lag is not None:
            if lag > s.max_lag_ms:
                s.max_lag_ms = lag
            if lag > s.window_max_lag_ms:
                s.window_max_lag_ms = lag
            if lag > s.watch_max_lag_ms:
                s.watch_max_lag_ms = lag


class WarmupMarker:
    """The ``warm-up`` subscriber (``--warmup-requests``, ``--warmup-seconds``; only subscribed
    when a warm-up is asked for), first to see each dispatch: a request is warm-up (``warmup``
    true) when it is one of the first ``requests`` sent by this process, or sent (its own
    ``sent_ns``) less than ``seconds`` after the run's anchor. Decided at the send, by the send
    time, so a request's flag never depends on when others ended."""

    def __init__(self, requests: int, seconds: float) -> None:
        self.left = requests
        self.until_ns = int(seconds * 1e9)

    def on_dispatched(self, res: RequestResult) -> None:
        if self.left > 0:
            self.left -= 1
            res.warmup = True
        elif res.sent_ns is not None and res.sent_ns < self.until_ns:
            res.warmup = True


class WarmupEnd:
    """The ``warm-up end`` subscriber: ``record("warmup_end")`` (the run's events,
    ``replayer.observe.events.RunEvents.record``) at the first request dispatched that is not
    warm-up; subscribed behind the warm-up marker, only with a warm-up."""

    def __init__(self, record: Callable[..., object]) -> None:
        self.record = record
        self.seen = False

    def on_dispatched(self, res: RequestResult) -> None:
        if not self.seen and not res.warmup:
            self.seen = True
            self.record("warmup_end")


class _Counts(Protocol):
    def on_slo(self, codes: dict[str, int]) -> None: ...
    def on_result(self, res: RequestResult) -> None: ...


class _Adds(Protocol):
    def add(self, res: RequestResult) -> None: ...


class Verdict:
    """Each result judged against the ``--goodput`` bounds (``slo_met`` set, the codes counted)."""

    def __init__(self, slos: dict[str, float], counts: _Counts) -> None:
        self.slos, self.counts = slos, counts

    def on_result(self, res: RequestResult) -> None:
        codes = judge_result(res, self.slos)
        if codes is not None:
            self.counts.on_slo(codes)


def result_fanout(
    *,
    slos: dict[str, float],
    metrics: _Counts,
    live: object,
    recorder: _Adds,
    warmup: object | None = None,
    warmup_end: object | None = None,
    tenants: object | None = None,
    targets: object | None = None,
    spans: object | None = None,
    live_window: object | None = None,
    verdicts: object | None = None,
    checks: object | None = None,
) -> list[Step]:
    """The run's subscribers in their order (module docstring): ``warm-up`` (and ``warm-up end``)
    only with a warm-up, ``verdict`` only with bounds, ``tenants`` with a mix, ``targets`` with
    several targets, ``spans`` with tracing on, ``live window``, ``verdicts`` and ``self-checks``
    when given."""
    steps: list[Step] = []
    if warmup is not None:
        steps.append(("warm-up", warmup))
    if warmup_end is not None:
        steps.append(("warm-up end", warmup_end))
    if slos:
        steps.append(("verdict", Verdict(slos, metrics)))
    steps.append(("metrics", metrics))
    if live_window is not None:
        steps.append(("live window", live_window))
    if tenants is not None:
        steps.append(("tenants", tenants))
    if targets is not None:
        steps.append(("targets", targets))
    steps.append(("live state", live))
    if spans is not None:
        steps.append(("spans", spans))
    if verdicts is not None:
        steps.append(("verdicts", verdicts))
    if checks is not None:  # (issue 47) self-checks that see every result: streams buffered on the way
        steps.append(("self-checks", checks))
    steps.append(("recorder", SimpleNamespace(on_result=recorder.add)))  # (its own bound method, no wrapper)
    return steps
