"""The fidelity verdict: the rule over its figures (pure), the fold of results, and runs against the
embedded simulator: a faithful one, one capped by --max-concurrency (not faithful, the cap named,
--fail-unfaithful exits 6)."""

import json
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import replay_against

from replayer.core import RequestResult
from replayer.core.result import to_table
from replayer.results.fidelity import FidelityBounds, FidelityFold, fidelity_lines, judge_fidelity
from replayer.run.finish import EXIT_UNFAITHFUL


def _res(row: int, due_ms: float, sent_ms: float, **kw) -> RequestResult:
    base = dict(input_length=16, prompt_len_sent=16, output_length=4, max_tokens=4, outcome="success")
    base.update(kw)
    return RequestResult(
        row=row,
        due_ns=int(due_ms * 1e6),
        sent_ns=int(sent_ms * 1e6),
        dispatch_lag_ms=sent_ms - due_ms - (kw.get("queue_wait_ms") or 0) - (kw.get("session_wait_ms") or 0),
        **base,
    )


def _judge(results: list[RequestResult], **kw) -> dict:
    fold = FidelityFold()
    fold.add(to_table(results))
    return judge_fidelity(fold.figures(), FidelityBounds(max_lag_ms=25.0), **kw)


def test_a_replay_on_time_is_faithful_and_session_waits_are_the_traces_own():
    rs = [_res(i, i * 20.0, i * 20.0 + 0.3) for i in range(100)]
    rs[10] = _res(10, 200.0, 260.3, session_wait_ms=60.0)  # (a turn held for its parent: faithful)
    sec = _judge(rs)
    assert sec["verdict"] == "faithful", sec["reasons"]
    assert sec["inter_arrival"]["ks_distance"] < 0.1
    assert sec["held_back"]["sessions"] == 1 and "waited for their parent" in sec["notes"][0]
    assert sec["dispatch_lag_ms"]["p99"] < 1


def test_a_run_behind_its_schedule_is_not_faithful():
    rs = [_res(i, i * 5.0, i * 12.0) for i in range(200)]  # (sends every 12 ms for arrivals every 5 ms)
    sec = _judge(rs)
    assert sec["verdict"] == "not_faithful"
    assert any("dispatch lag p99" in r for r in sec["reasons"])
    assert any("inter-arrivals differ" in r for r in sec["reasons"])
    assert sec["inter_arrival"]["p50"]["delta_ms"] == 7.0


def test_a_capped_run_names_the_cap_and_lost_rows_and_lengths_count():
    rs = [_res(i, i * 5.0, i * 5.0 + 40.0, queue_wait_ms=40.0) for i in range(50)]
    rs += [RequestResult(row=50 + i, due_ns=0, outcome="not_started") for i in range(5)]
    rs += [_res(60 + i, 300.0 + i, 300.0 + i, max_tokens=8) for i in range(20)]
    sec = _judge(rs, max_concurrency=2)
    assert sec["verdict"] == "not_faithful"
    text = " | ".join(sec["reasons"])
    assert "--max-concurrency 2 held back 50 requests" in text
    assert "5 rows scheduled were never sent" in text
    assert "another output length than the trace's" in text
    # a stopped run: rows not sent are said, not held against it
    assert "never sent" in " ".join(_judge(rs, max_concurrency=2, stopped_early=True)["notes"])
    assert fidelity_lines(sec)[0].startswith("Fidelity: not faithful")


def test_too_few_requests_are_not_judged_and_affinity_is_judged_with_several_targets():
    assert _judge([_res(i, i, i) for i in range(3)])["verdict"] == "not_judged"
    sec = _judge([_res(i, i * 10.0, i * 10.0) for i in range(20)], target_switches=2)
    assert sec["affinity_held"] is False and sec["verdict"] == "not_faithful"


# -- end to end, the embedded simulator ------------------------------------------------------------


def _trace(path) -> str:
    n = 60  # arrivals every 10 ms, each request ~60 ms: ~6 in flight
    t = pa.table(
        {
            "timestamp": [i * 10 for i in range(n)],
            "input_length": [32] * n,
            "output_length": [4] * n,
            "hash_ids": [[2 * i, 2 * i + 1] for i in range(n)],
        }
    ).replace_schema_metadata({"replayer.block_size": "16", "replayer.time_unit": "ms"})
    pq.write_table(t, path)
    return str(path)


def _run(tmp_path, name: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    res = tmp_path / name
    p = replay_against(_trace(tmp_path / "t.parquet"), None, res, *args, model=None, timeout=180)
    return p, json.loads((res / "summary.json").read_text())["fidelity"]


def test_a_run_on_schedule_is_judged_faithful(tmp_path):
    # (the lag bound is generous: the test asserts the judgement, not this shared machine's speed)
    p, sec = _run(tmp_path, "ok", "--fidelity-max-lag-ms", "500", "--fail-unfaithful")
    assert p.returncode == 0, p.stderr[-2000:]
    assert sec["verdict"] == "faithful", sec["reasons"]
    assert sec["sent"] == sec["rows"] == 60 and sec["trace_rows_in_window"] == 60
    assert "Fidelity: faithful" in p.stdout


def test_a_run_capped_far_below_the_traces_concurrency_is_not_faithful_and_names_the_cap(tmp_path):
    p, sec = _run(tmp_path, "capped", "--max-concurrency", "1", "--fail-unfaithful")
    assert p.returncode == EXIT_UNFAITHFUL == 6, p.stderr[-2000:]
    assert sec["verdict"] == "not_faithful"
    assert any(r.startswith("--max-concurrency 1 held back") for r in sec["reasons"]), sec["reasons"]
    assert "not faithful: --max-concurrency 1 held back" in p.stdout
    assert "exit 6" in p.stderr
