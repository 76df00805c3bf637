"""--idle-gap-cap: one mapping from trace time to replay time (offset, speed-up, then the cap in
replay seconds), case B34's exact values, the matrix of speed-up x cap x loop, and a whole run
whose results, summary and trace position follow it."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from replayer.plan import IdleGapCap, iter_schedule
from replayer.trace import read_trace

B34 = [
    {"timestamp": 0, "input_length": 16, "output_length": 2, "hash_ids": [0]},
    {"timestamp": 1000, "input_length": 16, "output_length": 2, "hash_ids": [1]},
    {"timestamp": 1201000, "input_length": 16, "output_length": 2, "hash_ids": [2]},
    {"timestamp": 1202000, "input_length": 16, "output_length": 2, "hash_ids": [3]},
]


@pytest.fixture
def b34(tmp_path):
    p = tmp_path / "b34.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in B34))
    return p


def _replay_ms(trace, speedup, cap_s, loops=1, loop_gap_ns=0):
    cap = IdleGapCap(cap_s, speedup) if cap_s else None
    sbs = list(iter_schedule(lambda: [trace], loops=loops, loop_gap_ns=loop_gap_ns, gap_cap=cap))
    return [float(x) for sb in sbs for x in sb.trace_ns / speedup / 1e6], cap


def test_b34_values(b34):
    t = read_trace(b34, block_size=16)
    due, cap = _replay_ms(t, 10, 60)
    assert due == [0, 100, 60_100, 60_200]  # not 120,100 (cap not converted), not 6,100 (cap in trace s)
    r = cap.report()
    assert r["gaps_capped"] == 1 and r["time_skipped_s"] == 60.0 and r["trace_time_skipped_s"] == 600.0
    assert r["map"] == [{"loop": 0, "row": 2, "trace_s": 1201.0, "replay_s": 60.1}]


@pytest.mark.parametrize("speedup", [1, 10, 2.5])
@pytest.mark.parametrize("cap_s", [None, 30, 60, 1000])
@pytest.mark.parametrize("loops", [1, 2])
def test_matrix_speedup_cap_loop(b34, speedup, cap_s, loops):
    t = read_trace(b34, block_size=16)
    gap_ns = 5_000_000_000
    due, _ = _replay_ms(t, speedup, cap_s, loops=loops, loop_gap_ns=gap_ns)
    # the reference: offsets (loop offsets included), / speed-up, then every gap capped in replay ms
    offs = []
    for k in range(loops):
        offs += [k * (1_202_000 + gap_ns / 1e6) + r["timestamp"] for r in B34]
    want, prev = [], None
    for o in offs:
        r = o / speedup
        want.append(0.0 if prev is None else want[-1] + min(r - prev, cap_s * 1e3 if cap_s else np.inf))
        prev = r
    assert due == pytest.approx(want, abs=1e-3)


def test_run_with_cap_records_due_times_summary_and_trace_position(b34, tmp_path):
    from replayer.config import load_config
    from replayer.record import read_results
    from replayer.run import run_replay

    # speed-up 1000, cap 0.06 s: B34's shape 100x faster (offsets 0, 1, 1201, 1202 ms replayed)
    res = tmp_path / "res"
    cfg = load_config(
        {
            "trace": str(b34),
            "block_size": 16,
            "speedup": 1000,
            "idle_gap_cap_s": 0.06,
            "results": str(res),
            "admin_port": 0,
            "quiet": True,
            "warm_connections": 2,
            "scrape_target_metrics": False,
        }
    )
    registry = CollectorRegistry()
    summary = asyncio.run(asyncio.wait_for(run_replay(cfg, registry=registry), 120))
    rows = sorted(read_results(str(res)).to_pylist(), key=lambda r: r["row"])
    assert [r["due_ns"] / 1e6 for r in rows] == pytest.approx([0, 1, 61, 62], abs=1e-6)
    g = summary["idle_gap_cap"]
    assert g["gaps_capped"] == 1 and g["time_skipped_s"] == pytest.approx(1.14)
    assert g["map"] == [{"loop": 0, "row": 2, "trace_s": 1201.0, "replay_s": pytest.approx(0.061)}]
    # the trace position is the trace's own: the last row sent is at trace second 1202
    assert registry.get_sample_value("replayer_trace_time_seconds") == pytest.approx(1202.0)
