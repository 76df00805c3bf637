"""The steady window of a sweep point and its judgement (replayer/results/steady.py), on scripted
per-request rows: no server, no event loop. Times are in seconds here, ns in the rows."""

import pytest

from replayer.results.steady import MIN_ACHIEVED_FRACTION, TRANSIENT_FRACTION, judge_point, steady_window

WHOLE_OK = {"slo_attainment": 1.0, "dispatch_lag_p99_ms": 1.0}


def rows(due_s, end_s, met=None, outcome=None):
    """The columns ``steady_window`` reads: each request sent at its due time, E2E to its end."""
    return (
        [round(d * 1e9) for d in due_s],
        [None if e is None else round(e * 1e9) for e in end_s],
        outcome or ["success" if e is not None else "failed" for e in end_s],
        met if met is not None else [e is not None for e in end_s],
        [None if e is None else (e - d) * 1e3 for d, e in zip(due_s, end_s)],
    )


def server(due_s, rate_rps, service_s):
    """End times of a FIFO server that completes at most ``rate_rps`` requests per second, each
    taking at least ``service_s``."""
    ends, last = [], -1.0
    for d in due_s:
        last = max(d + service_s, last + 1 / rate_rps)
        ends.append(last)
    return ends


def test_a_burst_shorter_than_its_latencies_never_holds():
    """300 requests at 256x: a 0.4 s burst, served at 12 requests/s over 25 s. Every request met
    an e2el bound of 30 s, so the whole run's attainment is 100% and the old rule said "held"."""
    due = [i * 0.4 / 299 for i in range(300)]
    ends = server(due, 12.0, 0.3)
    w = steady_window(*rows(due, ends))
    assert w is not None and w["too_short"] and not w["sustained"]
    assert w["span_s"] == pytest.approx(0.4)
    assert w["median_e2el_ms"] > 12_000  # the transients last one median E2E, far past the burst
    assert w["warmup_s"] == w["cooldown_s"] == pytest.approx(w["median_e2el_ms"] / 1e3)
    status, why = judge_point(WHOLE_OK, w, 0.9, 50.0)
    assert status == "window_too_short"
    assert "--max-requests" in why and "0.40 s offered span" in why


def test_a_steady_load_the_server_carries_holds():
    """300 requests at 10 requests/s (30 s), 0.3 s each, on a server with room to spare."""
    due = [i * 0.1 for i in range(300)]
    ends = server(due, 50.0, 0.3)
    w = steady_window(*rows(due, ends))
    assert not w["too_short"] and w["sustained"]
    span = 29.9
    assert w["warmup_s"] == w["cooldown_s"] == pytest.approx(TRANSIENT_FRACTION * span)
    assert w["start_s"] == pytest.approx(2.99) and w["end_s"] == pytest.approx(span - 2.99)
    assert w["window_s"] == pytest.approx(0.8 * span)
    assert w["offered_rps"] == pytest.approx(10.0, rel=0.02)
    assert w["achieved_rps"] == pytest.approx(10.0, rel=0.02)
    assert w["judged"] == w["met"] == w["due"] and w["slo_attainment"] == 1.0
    assert w["request_goodput"] == pytest.approx(w["offered_rps"])
    assert judge_point(WHOLE_OK, w, 0.9, 50.0)[0] == "held"


def test_a_load_the_server_falls_behind_is_not_sustained_even_with_every_slo_met():
    """600 requests at 14.4 requests/s on a server of 12 requests/s: the queue grows by 2.4
    requests a second, E2E reaches 8.6 s (under a 30 s bound), so attainment is 100%; but over the
    window the server completed 12 of every 14.4 requests offered."""
    due = [i / 14.4 for i in range(600)]
    ends = server(due, 12.0, 0.3)
    w = steady_window(*rows(due, ends))
    assert not w["too_short"] and not w["sustained"]
    assert w["achieved_rps"] == pytest.approx(12.0, rel=0.02)
    assert w["offered_rps"] == pytest.approx(14.4, rel=0.02)
    assert w["slo_attainment"] == 1.0
    status, why = judge_point(WHOLE_OK, w, 0.9, 50.0)
    assert status == "not_sustained" and "achieved 12.03 of 14.38 req/s" in why


def test_the_achieved_rule_allows_one_request_of_counting_granularity():
    """10 requests 1 s apart, 0.5 s each: the window [0.9, 8.1] s holds the due times 1..8 (8
    requests) and the ends 1.5..7.5 (7): 7 >= 0.9 * 8 - 1. One fewer end would not be."""
    due = [float(i) for i in range(10)]
    ends = [d + 0.5 for d in due]
    w = steady_window(*rows(due, ends))
    assert (w["due"], w["completed"]) == (8, 7) and w["sustained"]
    assert 6 < MIN_ACHIEVED_FRACTION * 8 - 1
    ends[3] = None  # failed: ended but did not complete
    w = steady_window(*rows(due, ends, met=[e is not None for e in ends]))
    assert w["completed"] == 6 and not w["sustained"]


def test_attainment_is_judged_over_the_window_and_unknown_is_left_out():
    """The first and last tenth of the span are left out: their misses do not count, and a
    request whose verdict is unknown is not judged."""
    due = [i * 0.1 for i in range(101)]  # a 10 s span: warm-up [0, 1] s, cool-down [9, 10] s
    ends = [d + 0.05 for d in due]
    met = [not (d < 0.95 or d > 9.05) for d in due]  # every transient request missed
    met[50] = None
    met[51] = False
    w = steady_window(*rows(due, ends, met=met))
    assert w["judged"] == w["due"] - 1 and w["met"] == w["judged"] - 1
    assert w["slo_attainment"] == pytest.approx((w["due"] - 2) / (w["due"] - 1))
    assert judge_point({**WHOLE_OK, "slo_attainment": 0.9}, w, 0.9, 50.0)[0] == "held"
    # the window's own misses do count
    met2 = [False if 30 <= i < 50 else m for i, m in enumerate(met)]
    status, why = judge_point(WHOLE_OK, steady_window(*rows(due, ends, met=met2)), 0.9, 50.0)
    assert status == "missed" and why.endswith("over the steady window")


def test_judge_point_order():
    """The replayer's lag first, then a stop, no verdict, a whole-run miss (even when the window is
    too short to judge), then the window."""
    due = [i * 0.001 for i in range(100)]
    burst = steady_window(*rows(due, server(due, 10.0, 0.1)))
    assert burst["too_short"]
    assert judge_point(None, burst, 0.9, 50.0)[0] == "error"
    status, why = judge_point({"slo_attainment": 0.5, "dispatch_lag_p99_ms": 80.0}, burst, 0.9, 50.0)
    assert status == "replayer_behind" and "dispatch lag p99 80 ms > 50 ms" in why  # not "missed"
    assert judge_point({"slo_attainment": 0.5, "dispatch_lag_p99_ms": 80.0}, burst, 0.9, 100.0)[0] == "missed"
    assert judge_point({**WHOLE_OK, "stopped_early": True, "stop_signal": "SIGTERM"}, burst, 0.9, 50.0)[0] == "stopped"
    assert judge_point({**WHOLE_OK, "slo_attainment": None}, burst, 0.9, 50.0)[0] == "no_verdict"
    assert judge_point({**WHOLE_OK, "slo_attainment": 0.5}, burst, 0.9, 50.0) == ("missed", "attainment 50.0% < 90%")
    assert judge_point(WHOLE_OK, None, 0.9, 50.0)[0] == "window_too_short"  # fewer than 2 requests


def test_no_window_without_two_due_times():
    assert steady_window([5], [6], ["success"], [True], [1.0]) is None
    assert steady_window([5, 5], [6, 6], ["success"] * 2, [True] * 2, [1.0] * 2) is None


@pytest.mark.parametrize(("e2e_s", "too_short"), [(0.9, False), (1.1, True)])
def test_a_window_shorter_than_the_median_e2e_is_too_short(e2e_s, too_short):
    """31 requests 0.1 s apart: a 3 s span. With 0.9 s requests the warm-up and cool-down are
    0.9 s each (more than a tenth of the span) and leave a 1.2 s window, longer than the E2E it
    judges; with 1.1 s requests the window (0.8 s) is shorter than one request."""
    due = [i * 0.1 for i in range(31)]
    w = steady_window(*rows(due, [d + e2e_s for d in due]))
    assert w["warmup_s"] == pytest.approx(e2e_s) and w["window_s"] == pytest.approx(3.0 - 2 * e2e_s)
    assert w["too_short"] is too_short
    assert (judge_point(WHOLE_OK, w, 0.9, 50.0)[0] == "window_too_short") is too_short
