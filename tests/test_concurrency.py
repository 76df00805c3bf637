"""Peak concurrency (``replayer.results.concurrency``): the most requests in flight at once, exact,
from send and end times. The pure sweep on scripted intervals (no event loop), then a real run
against the simulator: the summary (printed and in summary.json) and the report carry it."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from conftest import replay_against

from replayer.results.concurrency import PeakFold, peak_in_flight


def _brute(intervals):
    """The most intervals [s, e) holding any one instant (a start instant is where a peak begins)."""
    best, at = 0, None
    for t in sorted({s for s, e in intervals if e > s}):
        n = sum(1 for s, e in intervals if s <= t < e)
        if n > best:
            best, at = n, t
    return best, at


@pytest.mark.parametrize(
    ("intervals", "expected"),
    [
        ([], (0, None)),
        ([(0, 10)], (1, 0)),
        ([(0, 10), (10, 20)], (1, 0)),  # one ends as the other starts: they count once
        ([(0, 10), (10, 20), (10, 30)], (2, 10)),
        ([(0, 10), (5, 15), (5, 8), (8, 20)], (3, 5)),  # at 8 one ends, one starts: still 3, first at 5
        ([(0, 10), (3, 3), (3, 3)], (1, 0)),  # requests that took no time are never in flight
        ([(5, 9), (0, 100), (6, 7), (6, 8)], (4, 6)),  # out of order
    ],
)
def test_peak_on_scripted_intervals(intervals, expected):
    s = [a for a, _ in intervals]
    e = [b for _, b in intervals]
    assert peak_in_flight(s, e) == expected
    assert _brute(intervals) == expected


def test_peak_matches_a_brute_force_count_on_random_intervals():
    rng = np.random.default_rng(7)
    for _ in range(50):
        s = rng.integers(0, 200, 60)
        e = s + rng.integers(0, 30, 60)  # many shared instants, some of zero length
        assert peak_in_flight(s, e) == _brute(list(zip(s.tolist(), e.tolist())))


def test_fold_leaves_out_unknown_times_and_puts_each_run_on_one_axis():
    a = pa.table({"sent_ns": [0, 5, None, 6], "end_ns": [10, 12, None, None]})  # 2 at once; unknowns left out
    b = pa.table({"sent_ns": [0, 1, 2], "end_ns": [9, 9, 9]})  # 3 at once
    later = PeakFold()  # a resumed run, anchored 100 ns after the first: they do not overlap
    later.add(a)
    later.add(b, shift_ns=100)
    assert (later.peak().requests, later.peak().at_ns) == (3, 102)
    side_by_side = PeakFold()  # two workers anchored together: their requests add up
    side_by_side.add(a)
    side_by_side.add(b)
    peak = side_by_side.peak(t0_wall_s=1000.0)
    assert (peak.requests, peak.at_ns) == (5, 5)
    f = peak.fields()
    assert f["max_concurrent_requests"] == 5 and f["max_concurrent_requests_at_s"] == pytest.approx(5e-9)
    assert f["max_concurrent_requests_at_unix_s"] == pytest.approx(1000.0)
    assert PeakFold().peak().fields()["max_concurrent_requests"] == 0  # nothing sent: none in flight


def test_merged_workers_peak_is_swept_on_the_wall_clock(tmp_path):
    import pyarrow.parquet as pq

    from replayer.core import RequestResult
    from replayer.core.result import to_table
    from replayer.results import summarize_files
    from replayer.results.merge import merge_results

    s = 1_000_000_000
    dirs = []
    for k, (wall, intervals) in enumerate(
        [(1000.0, [(0, 4 * s), (1 * s, 2 * s)]), (1001.5, [(0, 1 * s), (int(0.2 * s), 3 * s)])]
    ):
        rs = [
            RequestResult(row=i, outcome="success", due_ns=a, sent_ns=a, end_ns=b, e2e_ms=(b - a) / 1e6)
            for i, (a, b) in enumerate(intervals)
        ]
        d = tmp_path / f"worker-{k}"
        d.mkdir()
        t = to_table(rs)
        pq.write_table(t.replace_schema_metadata({b"replayer.t0_wall_s": repr(wall).encode()}), d / "requests.parquet")
        dirs.append(str(d))
        one = summarize_files([str(d / "requests.parquet")])
        assert one["max_concurrent_requests"] == 2
    merged = merge_results(dirs, quiet=True)
    # on the wall clock (s after 1000): worker 0's [0, 4) and [1, 2), worker 1's [1.5, 2.5) and
    # [1.7, 4.5): all 4 at 1.7 s (each folder alone: 2)
    assert merged["max_concurrent_requests"] == 4
    assert merged["max_concurrent_requests_at_s"] == pytest.approx(1.7)
    assert merged["max_concurrent_requests_at_unix_s"] == pytest.approx(1001.7)


def test_a_run_reports_its_peak_in_the_summary_and_the_report(tmp_path, sim_process):
    # 5 requests due at once, each ~400 ms long, then 2 more after they all ended: the peak is 5
    url, _ = sim_process("--ttft-base-ms", "400", "--itl-base-ms", "1")
    trace = tmp_path / "t.jsonl"
    rows = [(0, i) for i in range(5)] + [(2000, 5), (2000, 6)]
    trace.write_text(
        "".join(
            json.dumps({"timestamp": ts, "input_length": 16, "output_length": 2, "hash_ids": [i]}) + "\n"
            for ts, i in rows
        )
    )
    res = tmp_path / "res"
    p = replay_against(trace, url, res, model=None, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((res / "summary.json").read_text())
    assert summary["max_concurrent_requests"] == 5
    from replayer.results import read_results

    t = read_results(str(res), columns=["sent_ns", "end_ns"])
    sent, end = t.column("sent_ns").to_pylist(), t.column("end_ns").to_pylist()
    assert summary["max_concurrent_requests_at_s"] == pytest.approx(sorted(sent)[4] / 1e9, abs=1e-6)  # the 5th send
    assert _brute(list(zip(sent, end)))[0] == 5
    assert "Peak concurrent requests" in p.stdout and " 5 (at " in p.stdout
    from replayer.results.report import render_html

    assert "at most 5 in flight at once (at " in render_html(str(res))
