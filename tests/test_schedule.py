"""Schedule: due times from one anchor, speed-up, cuts."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from replayer.plan.schedule import build_schedule


def test_speedup_divides_offsets():
    ts = np.array([0, 0, 3_000_000_000, 6_000_000_000], dtype=np.int64)
    assert build_schedule(ts).due_ns.tolist() == ts.tolist()
    assert build_schedule(ts, speedup=2).due_ns.tolist() == [0, 0, 1_500_000_000, 3_000_000_000]
    assert build_schedule(ts, speedup=10).due_ns.tolist() == [0, 0, 300_000_000, 600_000_000]


def test_cuts():
    ts = np.arange(10, dtype=np.int64) * 1_000_000_000
    assert len(build_schedule(ts, max_requests=3)) == 3
    s = build_schedule(ts, speedup=2, duration_s=2.0)  # due 0, .5, 1, 1.5 s
    assert s.due_ns.tolist() == [0, 500_000_000, 1_000_000_000, 1_500_000_000]
    assert len(build_schedule(ts, duration_s=100, max_requests=4)) == 4


@pytest.mark.parametrize("bad", [0, -1, float("nan")])
def test_bad_speedup(bad):
    with pytest.raises(ValueError):
        build_schedule(np.zeros(2, np.int64), speedup=bad)


@given(st.lists(st.integers(0, 10**12), min_size=1, max_size=200), st.floats(0.01, 1000))
def test_monotone_and_complete(offsets, speedup):
    ts = np.sort(np.array(offsets, dtype=np.int64))
    s = build_schedule(ts, speedup=speedup)
    assert len(s) == ts.size and np.all(np.diff(s.due_ns) >= 0)
    assert np.all(np.abs(s.due_ns - ts / speedup) <= 0.5 + 1e-6 * ts / speedup)


def test_a_start_time_long_past_is_not_kept():
    import time

    from replayer.core import Anchor, now_ns
    from replayer.core.clock import MAX_LATE_S

    def anchored(start_wall_s):
        """``Anchor.at(0.2, start_wall_s)`` with the clocks read just before and after it: the
        bounds below hold however long the machine kept this thread off the CPU in between."""
        m0, w0 = now_ns(), time.time()
        a = Anchor.at(0.2, start_wall_s=start_wall_s)
        w1, m1 = time.time(), now_ns()
        return a, (m0, m1), (w0, w1)

    def kept_at(a, start, mono, wall):
        # t0 is the start time moved onto the monotonic clock (1 ms: the two clocks' reads)
        assert mono[0] + (start - wall[1]) * 1e9 - 1e6 <= a.t0_ns <= mono[1] + (start - wall[0]) * 1e9 + 1e6
        assert a.wall_s == pytest.approx(start, abs=1e-6) and a.late_s == 0.0

    start = time.time() + 5.0
    soon, mono, wall = anchored(start)  # the future: kept
    kept_at(soon, start, mono, wall)
    start = time.time() - MAX_LATE_S / 2
    just, mono, wall = anchored(start)  # just past: kept (small catch-up)
    kept_at(just, start, mono, wall)  # (t0 ~0.5 s before the call: the overdue requests go at once)
    start = time.time() - 30.0
    late, mono, wall = anchored(start)  # long past: a start of its own, 0.2 s from now
    assert wall[0] - start <= late.late_s <= wall[1] - start and late.late_s >= 30.0
    assert mono[0] + 0.2e9 <= late.t0_ns <= mono[1] + 0.2e9
    assert wall[0] + 0.2 - 1e-3 <= late.wall_s <= wall[1] + 0.2 + 1e-3
