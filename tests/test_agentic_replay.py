"""An agentic session replayed: a call waits for its predecessor's end plus the tool batch the
predecessor asked for (--session-policy wait), and the hold is recorded as session_wait_ms,
apart from dispatch lag."""

from __future__ import annotations

import asyncio
import json

from faultserver import DONE, Plan, ThreadedFaultServer, choice, usage_event
from prometheus_client import CollectorRegistry

SESSION = {
    "session_id": "s",
    "turns": [
        {
            "turn_id": "t",
            "llm_calls": [
                {
                    "message_id": "m1",
                    "timestamp": "2026-06-01T00:00:00.000Z",
                    "duration_ms": 100.0,
                    "tokens": {"prompt": 64, "completion": 5, "cached": 0},
                },
                {
                    "message_id": "m2",
                    "timestamp": "2026-06-01T00:00:00.400Z",
                    "duration_ms": 100.0,
                    "tokens": {"prompt": 128, "completion": 6, "cached": 64},
                },
            ],
            "tool_batches": [
                {
                    "timestamp": "2026-06-01T00:00:00.100Z",
                    "duration_ms": 300.0,
                    "request_id": "m1",
                    "function_calls": [{"name": "run", "status": 1, "duration_ms": 300.0}],
                }
            ],
        }
    ],
}


def _plan(body) -> Plan:
    slow = body["max_tokens"] == 5  # the first call: 500 ms, far longer than its recorded 100 ms
    t = 500 if slow else 0
    return Plan([(t, choice("x", "length")), (t + 1, usage_event(16, body["max_tokens"])), (t + 2, DONE)])


def test_tool_wait_from_the_predecessors_end_recorded_as_session_wait(tmp_path):
    from replayer.config import load_config
    from replayer.record import read_results
    from replayer.run import run_replay

    trace = tmp_path / "copilot.jsonl"
    trace.write_text(json.dumps(SESSION) + "\n")
    with ThreadedFaultServer(_plan) as srv:
        cfg = load_config(
            {
                "trace": str(trace),
                "target": srv.url,
                "results": str(tmp_path / "res"),
                "admin_port": 0,
                "quiet": True,
                "warm_connections": 2,
                "scrape_target_metrics": False,
            }
        )
        asyncio.run(asyncio.wait_for(run_replay(cfg, registry=CollectorRegistry()), 120))
    first, second = sorted(read_results(str(tmp_path / "res")).to_pylist(), key=lambda r: r["turn"])
    assert first["outcome"] == second["outcome"] == "success"
    # due at 400 ms, but released only at the first call's end (>= 500 ms) + the 300 ms tool batch
    assert second["sent_ns"] >= first["end_ns"] + 300_000_000
    assert second["session_wait_ms"] >= 300 + 500 - 400 - 1
    assert first["session_wait_ms"] == 0
    # the hold is not dispatch lag: send - due = session wait + lag (lag from the release)
    total_ms = (second["sent_ns"] - second["due_ns"]) / 1e6
    assert abs(total_ms - (second["session_wait_ms"] + second["dispatch_lag_ms"])) < 0.01
