"""Streaming schedule: loops, shards, resume skips, and the re-anchoring timeline."""

from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings, strategies as st

from replayer.plan import Timeline, iter_schedule
from replayer.plan.schedule import shard_mask


@dataclass
class Batch:
    timestamp_ns: np.ndarray
    row_offset: int = 0
    session_id: list | None = None

    def __len__(self):
        return int(self.timestamp_ns.size)


def batches_of(ts, size, sessions=None):
    ts = np.asarray(ts, dtype=np.int64)
    out = []
    for a in range(0, ts.size, size):
        out.append(Batch(ts[a : a + size], a, None if sessions is None else sessions[a : a + size]))
    return lambda: iter(out)


def flat(sched):
    rows, tns, loops = [], [], []
    for sb in sched:
        rows += sb.rows.tolist()
        tns += sb.trace_ns.tolist()
        loops += [sb.loop] * len(sb)
    return rows, tns, loops


def test_loops_continue_in_trace_time():
    rows, tns, loops = flat(iter_schedule(batches_of([0, 5, 10], 2), loops=3, loop_gap_ns=100))
    assert rows == [0, 1, 2] * 3
    assert tns == [0, 5, 10, 110, 115, 120, 220, 225, 230]
    assert loops == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_forever_is_lazy_and_max_requests_cuts():
    rows, _, loops = flat(iter_schedule(batches_of([0, 1], 1), loops=None, max_requests=5))
    assert rows == [0, 1, 0, 1, 0] and loops == [0, 0, 1, 1, 2]


def test_max_requests_cuts_the_whole_schedule_before_shards_and_resume():
    ts = list(range(0, 100, 10))
    cut = [r for r, _, _ in zip(*flat(iter_schedule(batches_of(ts, 3), loops=2, max_requests=13)))]
    assert cut == list(range(10)) + [0, 1, 2]
    for shards in (2, 3):  # N shards together send the same first 13, once
        got = []
        for k in range(shards):
            rows, _, loops = flat(iter_schedule(batches_of(ts, 3), loops=2, max_requests=13, shard=k, shards=shards))
            got += list(zip(loops, rows))
        assert sorted(got) == sorted([(0, r) for r in range(10)] + [(1, r) for r in range(3)])
    # a resumed run of a finished one: every row of the first 13 is recorded, nothing is left
    done = {0: np.arange(10), 1: np.arange(3)}
    skip = lambda lp, rows: np.isin(rows, done.get(lp, []))  # noqa: E731
    assert flat(iter_schedule(batches_of(ts, 3), loops=2, max_requests=13, skip=skip))[0] == []
    assert flat(iter_schedule(batches_of(ts, 3), loops=2, max_requests=13, skip=skip, start_loop=1))[0] == []
    rows, _, loops = flat(iter_schedule(batches_of(ts, 3), loops=3, max_requests=25, start_loop=1))
    assert loops == [1] * 10 + [2] * 5 and rows == list(range(10)) + list(range(5))


def test_resume_skips_rows_in_first_loop_only():
    rows, tns, loops = flat(iter_schedule(batches_of([0, 5, 10], 2), loops=2, start_loop=0, skip_rows=2))
    assert rows == [2, 0, 1, 2] and loops == [0, 1, 1, 1] and tns == [10, 10, 15, 20]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), shards=st.integers(1, 7), size=st.integers(1, 64), with_sessions=st.booleans())
def test_shards_partition_every_row_once(n, shards, size, with_sessions):
    ts = np.sort(np.random.default_rng(n).integers(0, 10**9, n))
    sessions = [f"s{i % 13}" if i % 3 else None for i in range(n)] if with_sessions else None
    seen = []
    for k in range(shards):
        rows, tns, _ = flat(iter_schedule(batches_of(ts, size, sessions), shard=k, shards=shards))
        assert tns == ts[rows].tolist()  # each row keeps its own time
        seen += rows
    assert sorted(seen) == list(range(n))
    if with_sessions and shards > 1:  # a session lives in exactly one shard
        owner = {}
        for k in range(shards):
            for sb in iter_schedule(batches_of(ts, size, sessions), shard=k, shards=shards):
                for r in sb.rows.tolist():
                    if sessions[r] is not None:
                        assert owner.setdefault(sessions[r], k) == k


def test_shard_mask_balanced_without_sessions():
    m = [shard_mask(Batch(np.zeros(1000, np.int64)), k, 4).sum() for k in range(4)]
    assert m == [250, 250, 250, 250]


def test_timeline_speed_change_reanchors_without_burst():
    tl = Timeline(10.0)
    assert tl.due(10_000) == 1_000
    tl.set_speedup(20.0, now_ns=500)  # trace position at wall 500 is 5000
    assert tl.trace_at(500) == 5_000
    assert tl.due(5_000) == 500 and tl.due(7_000) == 600  # no jump back, no burst
    tl.pause(600)
    assert tl.paused and tl.due(7_000) > 10**15 and tl.trace_at(10_000) == 7_000
    tl.resume(2_000)  # continue from trace 7000 at wall 2000
    assert tl.due(7_000) == 2_000 and tl.due(9_000) == 2_100
