"""A session's later turns are not sent after an earlier turn failed (issue 47): each is
recorded cancelled with kind ``dependency``, and the summary gives the turns lost beside the
error rate; other sessions go on."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow.parquet as pq
from conftest import replay_against
from faultserver import DONE, Plan, ThreadedFaultServer, choice

from replayer.plan import SessionGate

OK = Plan(transcript=[(0, choice("x", finish="length", usage={"prompt_tokens": 4, "completion_tokens": 1})), (1, DONE)])
DOWN = Plan(status=500, content_type="application/json", body=b'{"error": "boom"}')


def test_the_gate_says_a_turn_after_a_failed_one_is_broken():
    g = SessionGate("wait")
    t1, t2 = SimpleNamespace(key="s", dep="s", think_ns=0), SimpleNamespace(key="s", dep="s", think_ns=0)
    other = SimpleNamespace(key="o", dep="o", think_ns=0)
    g.admit(t1, 0)
    g.started(t1)
    assert not g.broken(t2)
    g.failed(t1)
    assert g.broken(t2) and not g.broken(other)
    assert not SessionGate("off").broken(t2)


def test_turns_after_a_failed_turn_are_not_sent_and_counted_lost(tmp_path):
    rows = [
        {"timestamp": 0, "session_id": "a", "turn": 0},
        {"timestamp": 10, "session_id": "b", "turn": 0},
        {"timestamp": 300, "session_id": "a", "turn": 1},
        {"timestamp": 310, "session_id": "b", "turn": 1},
        {"timestamp": 600, "session_id": "a", "turn": 2},
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({**r, "input_length": 4, "output_length": 1, "hash_ids": [i]}) + "\n" for i, r in enumerate(rows)
        )
    )

    def plan(req):  # session a's first turn fails (the first request the server receives)
        plan.n += 1
        return DOWN if plan.n == 1 else OK

    plan.n = 0
    with ThreadedFaultServer(plan) as srv:
        p = replay_against(trace, srv.url, tmp_path / "r")
        received = len(srv.server.received)
    assert p.returncode == 0, p.stderr[-2000:]
    assert received == 3  # a's first turn, and b's two: a's later turns never went
    t = pq.read_table(tmp_path / "r" / "requests.parquet", columns=["row", "outcome", "error_kind", "sent_ns"])
    by_row = {r["row"]: r for r in t.to_pylist()}
    assert by_row[0]["outcome"] == "failed"
    for row in (2, 4):
        assert by_row[row]["outcome"] == "cancelled" and by_row[row]["error_kind"] == "dependency"
        assert by_row[row]["sent_ns"] is None
    assert by_row[1]["outcome"] == by_row[3]["outcome"] == "success"
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["sessions"]["turns_lost"] == 2 and s["failed"] == 1 and s["cancelled"] == 2
    assert "Turns lost (an earlier turn of the session failed)" in p.stdout
