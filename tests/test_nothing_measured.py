"""A run that measured nothing is not a success (issue 47): without ``--max-error-ratio``, a run
whose every request failed exits 3 and its summary says why; one success is enough for 0."""

from __future__ import annotations

import json

from conftest import replay_against
from faultserver import Plan, ThreadedFaultServer

from replayer.run.finish import error_ratio_problem, nothing_measured

DEAD = Plan(status=500, content_type="application/json", body=b'{"error": "down"}')


def test_every_request_failed_is_a_problem_without_a_ratio_and_one_success_is_not():
    s = {"completed": 0, "failed": 7, "errors_by_kind": {"http_status": 7}}
    assert error_ratio_problem(s, None) == (
        "all 7 requests that ended failed (http_status 7): the run measured nothing "
        "(--max-error-ratio 1 lets such a run pass): exit 3"
    )
    assert error_ratio_problem(s, 1.0) is None  # (asked for)
    assert nothing_measured({"completed": 1, "failed": 7}) is None
    assert nothing_measured({"completed": 0, "failed": 0}) is None  # nothing ended: not this rule


def test_a_run_against_a_server_that_fails_every_request_exits_3(tmp_path, mooncake_slice):
    trace = mooncake_slice(5)
    n = sum(1 for _ in open(trace))
    with ThreadedFaultServer(DEAD) as srv:
        p = replay_against(trace, srv.url, tmp_path / "r", "--speedup", "20")
    assert p.returncode == 3, p.stderr[-2000:]
    assert f"replayer: all {n} requests that ended failed (http_status {n}): the run measured nothing" in p.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["failed"] == n and summary["nothing_measured"].startswith(f"all {n} requests that ended failed")
