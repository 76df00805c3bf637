"""--session-header: every turn of a session carries its session id in the named header (or a
preset's: Dynamo, AIBrix), read back from the headers the server received."""

from __future__ import annotations

import asyncio
import json

import pytest
from faultserver import DONE, Plan, ThreadedFaultServer, choice, usage_event
from prometheus_client import CollectorRegistry

from replayer.payload.sessionkeys import session_header_lines, session_header_value

ROWS = [
    {"timestamp": 0, "session_id": "s1", "turn": 0, "input_length": 16, "output_length": 1, "hash_ids": [1]},
    {"timestamp": 10, "session_id": "s2", "turn": 0, "input_length": 16, "output_length": 1, "hash_ids": [2]},
    {"timestamp": 20, "input_length": 16, "output_length": 1, "hash_ids": [3]},
    {"timestamp": 30, "session_id": "s1", "turn": 1, "input_length": 32, "output_length": 1, "hash_ids": [1, 4]},
    {"timestamp": 40, "session_id": "agent/ü 1", "turn": 0, "input_length": 16, "output_length": 1, "hash_ids": [5]},
]


def _one_token() -> Plan:
    return Plan([(0, choice("x", "length")), (1, usage_event(16, 1)), (2, DONE)])


@pytest.mark.parametrize(
    "setting,name,extra",
    [
        ("X-Session-Id", "X-Session-Id", {}),
        ("dynamo", "X-Dynamo-Session-ID", {}),
        ("aibrix", "x-aibrix-session-key", {"routing-strategy": "session-affinity"}),
    ],
)
def test_every_turn_carries_its_session_id(tmp_path, setting, name, extra):
    from replayer.config import load_config
    from replayer.run import run_replay

    trace = tmp_path / "sessions.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    with ThreadedFaultServer(_one_token()) as srv:
        cfg = load_config(
            {
                "trace": str(trace),
                "block_size": 16,
                "target": srv.url,
                "session_header": setting,
                "results": str(tmp_path / "res"),
                "admin_port": 0,
                "quiet": True,
                "warm_connections": 2,
                "scrape_target_metrics": False,
            }
        )
        asyncio.run(asyncio.wait_for(run_replay(cfg, registry=CollectorRegistry()), 120))
        got = [r for r in srv.server.received if r.path.endswith("/completions")]
    lower = [{k.lower(): v for k, v in r.headers.items()} for r in got]
    by_prompt_len = {
        len(r.json["prompt"]) if isinstance(r.json["prompt"], list) else None: h for r, h in zip(got, lower)
    }
    assert len(got) == 5
    sent = sorted(h.get(name.lower()) or "" for h in lower)
    assert sent == ["", "agent/%C3%BC%201", "s1", "s1", "s2"]  # the row without a session: none
    assert by_prompt_len[32][name.lower()] == "s1"  # s1's second turn too
    for k, v in extra.items():
        assert all(h.get(k) == v for h in lower if h.get(name.lower()))


def test_header_lines_and_values():
    assert session_header_lines(None) is None
    assert session_header_lines("Dynamo") % b"x" == b"X-Dynamo-Session-ID: x\r\n"
    assert session_header_value("s", 3) == b"s.loop3"  # another pass is another conversation
    with pytest.raises(Exception, match="not a header name"):
        from replayer.config import load_config

        load_config({"trace": __file__, "session_header": "Bad: name"})
