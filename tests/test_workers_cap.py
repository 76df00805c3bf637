"""``--max-concurrency`` with ``--workers N`` (issue 47): the cap is the run's, split over the
workers (C // N each, the first C % N one more), so no more than C requests are in flight at the
server; a cap below N is refused (a worker would have no slot); the merged summary states the
run's cap and each process's share."""

from __future__ import annotations

import json

from conftest import replay_against
from faultserver import DONE, Plan, ThreadedFaultServer, choice

from replayer.config import load_config
from replayer.run.workers import cap_problem, worker_shares

SLOW = Plan(
    transcript=[(400, choice("x", finish="length", usage={"prompt_tokens": 4, "completion_tokens": 1})), (401, DONE)]
)


def test_the_cap_is_split_over_the_workers_and_a_cap_below_n_refused(tmp_path):
    trace = str(tmp_path / "t.jsonl")
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n')
    cfg = load_config({"trace": trace, "workers": 3, "max_concurrency": 8})
    assert [worker_shares(cfg, i) for i in range(3)] == [["--max-concurrency", s] for s in ("3", "3", "2")]
    assert cap_problem(cfg) is None
    low = load_config({"trace": trace, "workers": 4, "max_concurrency": 3})
    assert cap_problem(low).startswith("--max-concurrency 3 is split over the 4 workers, so some would have no slot")


def test_two_workers_keep_the_runs_cap_at_the_server(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [i]}) + "\n"
            for i in range(12)
        )
    )
    with ThreadedFaultServer(SLOW) as srv:
        p = replay_against(trace, srv.url, tmp_path / "r", "--workers", "2", "--max-concurrency", "3", timeout=180)
        peak = srv.server.peak_active
        refused = replay_against(trace, srv.url, tmp_path / "x", "--workers", "4", "--max-concurrency", "3", timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    assert peak <= 3, f"{peak} requests in flight at the server under a cap of 3"
    cap = json.loads((tmp_path / "r" / "summary.json").read_text())["concurrency_cap"]
    assert cap["max_concurrency"] == 3 and cap["per_process"] == [2, 1]
    assert refused.returncode == 2 and "no slot" in refused.stderr and not (tmp_path / "x" / "worker-0").exists()
