"""Rate limiting and overload told apart (issue 47): both are the error kind ``http_status`` per
request, and the summary's ``http_errors`` counts 429 (``rate_limited``), 503 (``overloaded``) and
any other status (``other``): a closed set."""

from __future__ import annotations

import itertools
import json

from conftest import replay_against
from faultserver import DONE, Plan, ThreadedFaultServer, choice

OK = Plan(transcript=[(0, choice("x", finish="length", usage={"prompt_tokens": 4, "completion_tokens": 1})), (1, DONE)])
PLANS = [
    Plan(status=429, content_type="application/json", body=b'{"error": "slow down"}'),
    Plan(status=503, content_type="application/json", body=b'{"error": "overloaded"}'),
    Plan(status=500, content_type="application/json", body=b'{"error": "boom"}'),
    OK,
]


def test_429_and_503_are_told_apart_in_the_summary(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": 100 * i, "input_length": 4, "output_length": 1, "hash_ids": [i]}) + "\n"
            for i in range(8)
        )
    )
    turn = itertools.count()
    with ThreadedFaultServer(lambda req: PLANS[next(turn) % 4]) as srv:
        p = replay_against(trace, srv.url, tmp_path / "r")
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["errors_by_kind"] == {"http_status": 6}  # (the kinds unchanged: one per failure)
    assert s["http_errors"] == {"rate_limited": 2, "overloaded": 2, "other": 2}
    assert "HTTP errors: 429 rate limited / 503 overloaded / other" in p.stdout and "2 / 2 / 2" in p.stdout
