"""The open loop's decisions in virtual time (``replayer.plan.planner``): tables of (time, what the
planner answers), no clock, no event loop."""

from __future__ import annotations

import pytest

from replayer.core import PreparedRequest
from replayer.core.clock import SPIN_NS
from replayer.plan import Planner, SessionGate, Timeline
from replayer.plan.planner import END, LATER, NEVER, PREPARE, RETRY_HAND_OVER_NS, Wake

MS = 1_000_000


def _req(i: int, trace_ms: int, *, key=None, dep=None) -> PreparedRequest:
    t = trace_ms * MS
    return PreparedRequest(
        index=i,
        row=i,
        due_ns=t,
        body=b"{}",
        input_length=1,
        output_length=1,
        prompt_len=1,
        max_tokens=1,
        trace_ns=t,
        key=key,
        dep=dep,
    )


def _planner(trace_ms: list[int], **kw) -> Planner:
    plan = Planner(kw.pop("timeline", Timeline(1.0)), **kw)
    for i, t in enumerate(trace_ms):
        plan.add(_req(i, t), t * MS, now_ns=0)
    return plan


def _rows(fires) -> list[tuple[int, int]]:
    return [(f.req.row, f.due_ns // MS) for f in fires]


def test_requests_fire_at_their_due_time_never_before():
    plan = _planner([10, 10, 20, 35])
    table = [  # (now ms, rows fired with their due time in ms)
        (0, []),
        (9, []),
        (10, [(0, 10), (1, 10)]),
        (10, []),
        (19, []),
        (25, [(2, 20)]),
        (35, [(3, 35)]),
        (99, []),
    ]
    assert [(now, _rows(plan.due(now * MS))) for now, _ in table] == table


def test_the_wake_time_is_the_next_due_time_or_the_lead_window_of_the_next_item():
    plan = _planner([10, 40])
    assert plan.wake(0, None) == Wake(10 * MS, precise=True)
    plan.due(10 * MS)
    assert plan.wake(11 * MS, None) == Wake(40 * MS, precise=True)
    plan.due(40 * MS)
    # nothing prepared: wake when the next schedule item enters the lead window (500 ms)
    assert plan.wake(41 * MS, 2000 * MS) == Wake(1500 * MS, precise=True)
    assert plan.wake(41 * MS, None) is None  # no item known: read the next batch at once
    plan.exhausted = True
    assert plan.finished


@pytest.mark.parametrize(
    "now_ms, catching_up, expected",
    [
        (0, False, PREPARE),  # due at 400 ms, within the 500 ms lead window
        (0, True, LATER),  # behind schedule: only what is overdue is prepared now
        (400, True, PREPARE),
    ],
)
def test_preparation_runs_through_the_lead_window(now_ms, catching_up, expected):
    plan = Planner(Timeline(1.0), lead_ns=500 * MS)
    assert plan.next_item(400 * MS, now_ms * MS, catching_up) == expected
    assert plan.next_item(501 * MS, 0) == LATER


def test_duration_ends_the_schedule_and_speedup_scales_due_times():
    plan = Planner(Timeline(2.0), duration_ns=100 * MS)
    assert plan.next_item(150 * MS, 0) == PREPARE  # due at 75 ms
    assert plan.next_item(200 * MS, 0) == END  # due at 100 ms: not before --duration
    assert plan.exhausted


def test_a_resumed_run_rebases_on_its_first_item():
    plan = Planner(Timeline(1.0), rebase_first=True)
    assert plan.next_item(7_000 * MS, 0) == PREPARE
    plan.add(_req(0, 7_000), 7_000 * MS, 0)
    assert _rows(plan.due(0)) == [(0, 0)]  # due at the anchor, not 7 s later


def test_preparation_stops_for_the_head_only_within_the_spin_window():
    plan = _planner([10])
    assert not plan.must_act(10 * MS - SPIN_NS - 1)
    assert plan.must_act(10 * MS - SPIN_NS)
    assert not plan.head_overdue(9 * MS) and plan.head_overdue(10 * MS)


def test_requests_are_handed_over_ahead_and_a_refused_one_is_retried_until_due():
    plan = _planner([100, 100, 300], ahead_ns=50 * MS)
    # wake at the hand-over time, imprecisely (it need only happen before the due time)
    assert plan.wake(0, None) == Wake(50 * MS, precise=False)
    assert plan.hand_over(49 * MS) is None
    h = plan.hand_over(50 * MS)
    assert (h.req.row, h.due_ns) == (0, 100 * MS)
    plan.taken()
    h = plan.hand_over(51 * MS)
    assert h.req.row == 1
    plan.not_taken(51 * MS)  # no idle connection for it now
    assert plan.hand_over(52 * MS) is None  # retried 2 ms later, not before
    assert plan.wake(52 * MS, None) == Wake(51 * MS + RETRY_HAND_OVER_NS, precise=False)
    assert plan.hand_over(51 * MS + RETRY_HAND_OVER_NS).req.row == 1
    plan.not_taken(99 * MS)
    assert plan.wake(99 * MS, None) == Wake(100 * MS, precise=True)  # its retry is past its due time
    assert _rows(plan.due(100 * MS)) == [(1, 100)]  # then it fires at its due time
    assert plan.fired_late == 1
    assert plan.hand_over(200 * MS) is None and plan.hand_over(250 * MS).req.row == 2


def test_nothing_fires_or_is_handed_over_while_paused():
    tl = Timeline(1.0)
    plan = _planner([10, 20], timeline=tl, ahead_ns=5 * MS)
    tl.pause(5 * MS)
    assert plan.due(1_000 * MS) == [] and plan.hand_over(1_000 * MS) is None
    tl.resume(1_000 * MS)  # trace position 5 ms: the rest shifts by 995 ms
    assert plan.due(1_004 * MS) == [] and plan.hand_over(1_000 * MS).due_ns == 1_005 * MS


def test_a_session_turn_waits_for_its_predecessor_and_its_wait_is_recorded():
    gate = SessionGate("wait")
    plan = Planner(Timeline(1.0), gate=gate, ahead_ns=50 * MS)
    first, second = _req(0, 0, key="s", dep="s"), _req(1, 10, key="s", dep="s")
    plan.add(first, 0, 0)
    plan.add(second, 10 * MS, 0)
    assert plan.hand_over(0) is None  # session turns are never handed over
    assert _rows(plan.due(0)) == [(0, 0)]
    assert plan.due(10 * MS) == []  # held: its predecessor is in flight
    plan.exhausted = True
    assert not plan.finished  # a turn waits in the gate: woken by a change
    assert plan.wake(10 * MS, None) == Wake(NEVER)
    fired = plan.ended(first, 30 * MS)  # released when the first ends, 20 ms late
    assert _rows(fired) == [(1, 10)] and second.release_ns == 30 * MS
    assert plan.finished and plan.fired_late == 0


def test_a_turn_released_while_stopping_is_kept_as_not_started():
    plan = Planner(Timeline(1.0), gate=SessionGate("wait"))
    first, second = _req(0, 0, key="s", dep="s"), _req(1, 10, key="s", dep="s")
    plan.add(first, 0, 0)
    plan.add(second, 10 * MS, 0)
    plan.due(10 * MS)
    assert plan.ended(first, 20 * MS, stopping=True) == []
    assert plan.take_held() == [second]


def test_demand_counts_requests_within_the_connect_horizon_at_most_every_millisecond():
    plan = _planner([10, 50, 120, 500], connect_ahead_ns=100 * MS)
    assert plan.demand(0) == 2  # due at 10 and 50 ms
    assert plan.demand(MS // 2) is None  # counted again only 1 ms later
    assert plan.demand(30 * MS) == 3
    assert _planner([10]).demand(0) is None  # no counting without a horizon
    # the wait ends early to count a request entering the horizon
    assert _planner([500], connect_ahead_ns=100 * MS).wake(0, None) == Wake(400 * MS, precise=True)


def test_overdue_and_take_held_account_for_every_prepared_request():
    plan = _planner([0, 5, 10, 20])
    plan.due(5 * MS)
    assert plan.overdue(15 * MS) == 1
    assert [r.row for r in plan.take_held()] == [2, 3]
    assert plan.pending == type(plan.pending)()
