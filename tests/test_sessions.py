"""Multi-turn sessions: a turn never goes before its predecessor ended; the wait is recorded apart
from dispatch lag. The gate alone, then whole replays against the simulator."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replayer.plan import SessionGate


def _req(key=None, dep=None, think_ns=0, name=""):
    return SimpleNamespace(key=key, dep=dep, think_ns=think_ns, name=name)


# -- the gate -------------------------------------------------------------------------------------
def test_a_turn_waits_for_the_previous_turn_and_goes_at_its_end_plus_think_time():
    g = SessionGate("wait")
    t1, t2, t3 = (_req("s", "s", think_ns=5, name=f"t{i}") for i in (1, 2, 3))
    assert g.admit(t1, 100) == 100
    g.started(t1)
    assert g.admit(t2, 150) is None and g.admit(t3, 160) is None  # both wait, in order
    assert g.waiting == 2
    released = g.finished(t1, 400)
    assert [(r.name, at) for r, at in released] == [("t2", 405)]  # only the next turn
    assert g.finished(t2, 500) == [(t3, 505)]
    assert g.finished(t3, 600) == [] and g.waiting == 0


def test_a_turn_due_after_its_predecessor_ended_goes_at_the_later_of_due_and_end_plus_think():
    g = SessionGate("wait")
    t1, t2, t3 = _req("s", "s"), _req("s", "s", think_ns=1000), _req("s", "s", think_ns=10)
    g.started(t1)
    g.finished(t1, 500)
    assert g.admit(t2, 600) == 1500  # think time pushes it past its trace time
    g.started(t2)
    g.finished(t2, 2000)
    assert g.admit(t3, 3000) == 3000  # trace time is later: it goes on time
    assert g.held == 1


def test_no_think_policy_and_off_policy():
    g = SessionGate("wait-no-think")
    a, b = _req("s", "s"), _req("s", "s", think_ns=10**9)
    g.started(a)
    assert g.admit(b, 10) is None
    assert g.finished(a, 50) == [(b, 50)]
    off = SessionGate("off")
    a, b = _req("s", "s"), _req("s", "s")
    off.started(a)
    assert off.admit(b, 10) == 10 and off.finished(a, 50) == []
    with pytest.raises(ValueError, match="session policy"):
        SessionGate("later")


def test_children_of_one_parent_are_released_together_and_grandchildren_wait_for_their_parent():
    g = SessionGate("wait")
    p = _req(key="p", dep=None, name="p")
    c1, c2 = _req(key="c1", dep="p", name="c1"), _req(key="c2", dep="p", name="c2")
    gc = _req(key="g", dep="c1", name="gc")
    assert g.admit(p, 0) == 0
    g.started(p)
    assert g.admit(c1, 1) is None and g.admit(c2, 2) is None
    out = g.finished(p, 10)
    assert sorted(r.name for r, _ in out) == ["c1", "c2"]
    assert g.admit(gc, 11) is None  # c1 is in flight now
    assert g.finished(c2, 20) == []
    assert g.finished(c1, 30) == [(gc, 30)]


def test_ended_keys_are_bounded_and_take_waiting_empties_the_queues():
    g = SessionGate("wait", max_ended=2)
    for k in ("a", "b", "c"):
        r = _req(k, k)
        g.started(r)
        g.finished(r, 100)
    assert g.admit(_req("a", "a", think_ns=50), 120) == 120  # 'a' evicted: goes at its trace time
    assert g.admit(_req("c", "c", think_ns=50), 120) == 150
    x, y = _req("x", "x"), _req("x", "x")
    g.started(x)
    assert g.admit(y, 5) is None
    assert g.take_waiting() == [y] and g.waiting == 0


def test_think_time_is_scaled_like_trace_time():
    g = SessionGate("wait", scale=lambda ns: ns // 10)
    a, b = _req("s", "s"), _req("s", "s", think_ns=1000)
    g.started(a)
    assert g.admit(b, 0) is None
    assert g.finished(a, 50) == [(b, 150)]


# -- whole replays against the simulator -----------------------------------------------------------
def _session_trace(path, sessions=6, turns=4, gap_ms=20, extra=None):
    """Sessions whose turns are `gap_ms` apart in trace time: far less than a turn takes."""
    rows = {"timestamp": [], "input_length": [], "output_length": [], "hash_ids": [], "session_id": []}
    k = 0
    for t in range(turns):
        for s in range(sessions):
            rows["timestamp"].append(t * gap_ms + s)
            rows["input_length"].append(64 * (t + 1))
            rows["output_length"].append(20)
            rows["hash_ids"].append([1000 * s + j for j in range(t + 1)])
            rows["session_id"].append(f"s{s}")
            k += 1
    for name, values in (extra or {}).items():
        rows[name] = values
    table = pa.table(rows)
    table = table.replace_schema_metadata({"replayer.block_size": "64", "replayer.time_unit": "ms"})
    pq.write_table(table, path)
    return path, k


def _replay(tmp_path, trace, url, *args):
    res = tmp_path / "res"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace),
            "--target",
            url,
            "--results",
            str(res),
            "--admin-port",
            "0",
            "--quiet",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rows = pq.read_table(res / "requests.parquet").to_pylist()
    return rows, json.loads((res / "summary.json").read_text())


def _by_session(rows):
    out = {}
    for r in sorted(rows, key=lambda r: r["row"]):
        out.setdefault(r["session_id"], []).append(r)
    return out


def test_every_turn_goes_after_its_predecessor_ended(tmp_path, sim_process):
    # 20 tokens x 10 ms: a turn takes ~200 ms; its successor is due 20 ms later in the trace
    url, _ = sim_process("--itl-base-ms", "10", "--ttft-base-ms", "5")
    trace, n = _session_trace(tmp_path / "t.parquet")
    rows, summary = _replay(tmp_path, trace, url)
    assert len(rows) == n and all(r["outcome"] == "success" for r in rows)
    for turns in _by_session(rows).values():
        assert turns[0]["session_wait_ms"] == 0.0
        for prev, cur in zip(turns, turns[1:]):
            assert cur["sent_ns"] >= prev["end_ns"]  # never before it ended
            assert cur["session_wait_ms"] > 100  # held back ~one turn
            # released at the predecessor's end: the replayer itself was not late
            release_ns = cur["due_ns"] + cur["session_wait_ms"] * 1e6
            assert release_ns >= prev["end_ns"] - 1e6
            # the dispatch lag counts from the release, not from the due time (the hold is the
            # server's slowness, recorded as session_wait_ms): sent = due + wait + lag, the wait
            # not counted twice (no bound on how late a busy machine sent it)
            assert cur["dispatch_lag_ms"] >= 0
            assert abs(release_ns + cur["dispatch_lag_ms"] * 1e6 - cur["sent_ns"]) <= 1e3
    s = summary["sessions"]
    assert s["sessions"] == 6 and s["turns_held"] == n - 6
    assert s["session_wait_ms"]["p50"] > 100


def test_session_policy_off_replays_trace_times_and_turns_overlap(tmp_path, sim_process):
    url, _ = sim_process("--itl-base-ms", "10", "--ttft-base-ms", "5")
    trace, n = _session_trace(tmp_path / "t.parquet")
    rows, _ = _replay(tmp_path, trace, url, "--session-policy", "off")
    assert all(r["session_wait_ms"] is None for r in rows)
    overlapping = sum(
        cur["sent_ns"] < prev["end_ns"] for turns in _by_session(rows).values() for prev, cur in zip(turns, turns[1:])
    )
    assert overlapping == n - 6


def test_a_child_held_for_its_parent_already_blocks_its_own_children():
    g = SessionGate("wait")
    p, c, gc = _req("p", None), _req("c", "p"), _req("g", "c")
    g.started(p)
    assert g.admit(c, 1) is None
    assert g.admit(gc, 2) is None  # c has not even been sent yet
    assert g.finished(p, 10) == [(c, 10)]
    assert g.finished(c, 20) == [(gc, 20)]


def test_the_sessionized_mooncake_trace_replays_every_turn_after_its_predecessor(tmp_path, mooncake_slice, sim_process):
    src = mooncake_slice(90)
    trace = tmp_path / "sessions.parquet"
    p = subprocess.run(
        [sys.executable, "-m", "replayer", "trace", "sessionize", str(src), "-o", str(trace)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    url, _ = sim_process("--itl-base-ms", "1")  # (the order is checked: short turns keep the chains short)
    rows, summary = _replay(tmp_path, trace, url, "--speedup", "30")
    assert all(r["outcome"] == "success" for r in rows)
    chains = [t for t in _by_session(rows).values() if len(t) > 1]
    assert len(chains) >= 10
    for turns in chains:
        assert [t["turn"] for t in turns] == list(range(len(turns)))
        for prev, cur in zip(turns, turns[1:]):
            assert cur["sent_ns"] >= prev["end_ns"]
    s = summary["sessions"]
    assert s["turns"] == len(rows) and s["sessions"] == len(_by_session(rows))
    print(json.dumps(s))
