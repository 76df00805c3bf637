"""The one result path: every result reaches each step of the run's fan-out once, in order
(verdict -> metrics -> tenant/target groups -> live state -> recorder), and the dispatcher hands
results to nothing else. Pure: fakes for the steps, virtual time for the dispatcher."""

from __future__ import annotations

from test_dispatcher import _run

from replayer.core import RequestResult
from replayer.core.slo import MET, MISSED
from replayer.run import result_fanout
from replayer.send.dispatcher import Observer


class Step:
    """A fake step: records (step name, row, slo_met as it saw it) into a shared log."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log, self.slo_codes = name, log, []

    def on_result(self, res: RequestResult) -> None:
        self.log.append((self.name, res.row, res.slo_met))

    add = on_result

    def on_slo(self, codes: dict[str, int]) -> None:
        self.slo_codes.append(codes)


def test_each_result_goes_through_every_step_once_in_order():
    log: list = []
    metrics, live, rec = Step("metrics", log), Step("live state", log), Step("recorder", log)
    tenants, targets = Step("tenants", log), Step("targets", log)
    fan = result_fanout(
        slos={"ttft": 100.0}, metrics=metrics, live=live, recorder=rec, tenants=tenants, targets=targets
    )
    assert fan.names == ("verdict", "metrics", "tenants", "targets", "live state", "recorder")
    fan(RequestResult(row=1, outcome="success", ttft_ms=50.0, e2e_ms=60.0))
    fan(RequestResult(row=2, outcome="success", ttft_ms=500.0, e2e_ms=600.0))
    # the verdict came first: every later step saw slo_met set, and its codes were counted
    assert log == [(name, row, met) for row, met in ((1, True), (2, False)) for name in fan.names[1:]]
    assert [c["all"] for c in metrics.slo_codes] == [MET, MISSED]


def test_without_bounds_a_mix_or_several_targets_the_fan_out_is_metrics_live_state_recorder():
    log: list = []
    fan = result_fanout(slos={}, metrics=Step("metrics", log), live=Step("live", log), recorder=Step("rec", log))
    assert fan.names == ("metrics", "live state", "recorder")
    res = RequestResult(row=7, outcome="success", ttft_ms=1.0)
    fan(res)
    assert log == [("metrics", 7, None), ("live", 7, None), ("rec", 7, None)] and res.slo_met is None


def test_the_dispatcher_hands_each_result_to_its_sink_alone():
    # the observer has no result hook any more: a result's only way on is the sink (the fan-out)
    assert not hasattr(Observer, "on_result")
    by_row, d, _, error = _run([0, 5, 5, 10, 40])  # (it fails when a result is delivered twice)
    assert error is None and sorted(by_row) == [0, 1, 2, 3, 4] and d.sent == 5
