"""The one event stream: every request's events reach the run's subscribers in their stated order
(warm-up -> verdict -> metrics -> tenant/target groups -> live state -> spans -> recorder), each
once; the factory, the dispatcher and the client tell it and nothing else. Pure: fakes for the
subscribers, virtual time for the dispatcher."""

from __future__ import annotations

import ast
from pathlib import Path

from eventlog import EventLog
from test_dispatcher import _run

from replayer.core import PreparedRequest, RequestResult
from replayer.core.slo import MET, MISSED
from replayer.run import result_fanout
from replayer.run.fanout import EventStream

ROOT = Path(__file__).resolve().parents[1]


class Step:
    """A fake subscriber: records (name, event, row, slo_met as it saw it) into a shared log."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log, self.slo_codes = name, log, []

    def on_prepared(self, req: PreparedRequest) -> None:
        self.log.append((self.name, "prepared", req.row, None))

    def on_sent(self, req: PreparedRequest) -> None:
        self.log.append((self.name, "sent", req.row, None))

    def on_dispatched(self, res: RequestResult) -> None:
        self.log.append((self.name, "dispatched", res.row, res.warmup))

    def on_result(self, res: RequestResult) -> None:
        self.log.append((self.name, "finished", res.row, res.slo_met))

    add = on_result

    def on_slo(self, codes: dict[str, int]) -> None:
        self.slo_codes.append(codes)


class ResultsOnly:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def on_result(self, res: RequestResult) -> None:
        self.log.append((self.name, "finished", res.row, res.slo_met))


class Warmup:
    def on_dispatched(self, res: RequestResult) -> None:
        res.warmup = True


def test_each_result_goes_through_every_subscriber_once_in_order():
    log: list = []
    metrics, live = Step("metrics", log), ResultsOnly("live state", log)
    events = EventStream(
        result_fanout(
            slos={"ttft": 100.0},
            metrics=metrics,
            live=live,
            recorder=Step("recorder", log),
            tenants=ResultsOnly("tenants", log),
            targets=ResultsOnly("targets", log),
        )
    )
    assert events.names() == ("verdict", "metrics", "tenants", "targets", "live state", "recorder")
    events.finished(RequestResult(row=1, outcome="success", ttft_ms=50.0, e2e_ms=60.0))
    events.finished(RequestResult(row=2, outcome="success", ttft_ms=500.0, e2e_ms=600.0))
    # the verdict came first: every later subscriber saw slo_met set, and its codes were counted
    names = events.names()[1:]
    assert log == [(name, "finished", row, met) for row, met in ((1, True), (2, False)) for name in names]
    assert [c["all"] for c in metrics.slo_codes] == [MET, MISSED]


def test_each_event_reaches_the_subscribers_that_have_its_hook_in_order():
    log: list = []
    events = EventStream(
        result_fanout(
            slos={}, metrics=Step("metrics", log), live=Step("live", log), recorder=Step("rec", log), warmup=Warmup()
        )
    )
    assert events.names("prepared") == ("metrics", "live state") == events.names("sent")
    assert events.names("dispatched") == ("warm-up", "metrics", "live state")
    assert events.names("finished") == ("metrics", "live state", "recorder")
    req = PreparedRequest(
        index=0, row=7, due_ns=0, body=b"", input_length=1, output_length=1, prompt_len=1, max_tokens=1
    )
    res = req.new_result(0)
    events.prepared(req)
    events.sent(req)
    events.dispatched(res)
    events.finished(res)
    assert log == [
        ("metrics", "prepared", 7, None),
        ("live", "prepared", 7, None),
        ("metrics", "sent", 7, None),
        ("live", "sent", 7, None),
        ("metrics", "dispatched", 7, True),  # the warm-up marker came first: everyone saw the flag
        ("live", "dispatched", 7, True),
        ("metrics", "finished", 7, None),
        ("live", "finished", 7, None),
        ("rec", "finished", 7, None),
    ]


def test_a_stream_built_before_its_subscribers_drops_events_until_they_are_attached():
    log: list = []
    events = EventStream()
    res = RequestResult(row=3)
    events.finished(res)  # (nothing attached yet: dropped)
    events.subscribe(
        [("one", ResultsOnly("one", log)), ("two", ResultsOnly("two", log)), ("three", Step("three", log))]
    )
    events.finished(res)
    assert log == [("one", "finished", 3, None), ("two", "finished", 3, None), ("three", "finished", 3, None)]


def test_the_dispatcher_tells_each_result_once_and_each_send():
    by_row, d, _, error = _run([0, 5, 5, 10, 40])  # (it fails when a result is delivered twice)
    assert error is None and sorted(by_row) == [0, 1, 2, 3, 4] and d.sent == 5


def test_no_stage_is_handed_a_callback_of_the_run():
    # the stages take the event stream at construction; the hooks the root once injected are gone
    sources = {p: (ROOT / "replayer" / p).read_text() for p in ("send/dispatcher.py", "send/feed.py", "http/client.py")}
    for path, text in sources.items():
        tree = ast.parse(text)
        names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
            a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs
        }
        assert not names & {"on_dispatched", "on_sent", "sink", "observer", "_sink", "obs"}, path


def test_the_event_log_sees_a_request_prepared_sent_and_finished_in_that_order():
    log = EventLog()
    req = PreparedRequest(
        index=0, row=1, due_ns=0, body=b"", input_length=1, output_length=1, prompt_len=1, max_tokens=1
    )
    log.prepared(req)
    log.sent(req)
    log.finished(req.new_result(0))
    assert log.log == [("prepared", 1), ("sent", 1), ("finished", 1)]
