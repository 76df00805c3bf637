"""The regression gate (issue 45): pairing by trace position, the block bootstrap's verdicts,
the gate file, and ``replayer compare --gate`` end to end against real simulators.

The statistics are tested on tables built here (no event loop); the command on real runs. The
gate's false-alarm and detection rates are measured by bench/bench_gate.py, not asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pyarrow as pa
import pytest

from replayer.results.gate import NotComparable, judge, overall, pair
from replayer.results.gatespec import default_spec, load_gate_file, metric, spec_from_dict

N = 600


def run_table(
    seed: int,
    ttft_scale: float = 1.0,
    n: int = N,
    loops: int = 1,
    input_length: np.ndarray | None = None,
    speedup: float = 1.0,
    failed: int = 0,
) -> pa.Table:
    """A run's results as the gate reads them: per row, TTFT depends on the row (the workload:
    a burst every 100 rows) plus noise of its own run; ITL lists of 8 gaps."""
    rng = np.random.default_rng(seed)
    rows = np.tile(np.arange(n), loops)
    loop = np.repeat(np.arange(loops), n)
    m = len(rows)
    workload = 50.0 + 40.0 * ((rows % 100) < 10)  # ms: the trace's own bursts
    ttft = ttft_scale * workload * rng.lognormal(0, 0.1, m)
    tpot = 10.0 * rng.lognormal(0, 0.05, m)
    outcome = np.array(["success"] * m, dtype=object)
    outcome[rng.choice(m, failed, replace=False)] = "failed"
    itl = [list(map(float, tpot[i] * rng.lognormal(0, 0.05, 8))) for i in range(m)]
    lengths = input_length if input_length is not None else 100 + rows % 37
    return pa.table(
        {
            "row": pa.array(rows, pa.int64()),
            "loop": pa.array(loop, pa.int32()),
            "warmup": pa.array([False] * m),
            "outcome": pa.array(outcome.tolist(), pa.string()),
            "input_length": pa.array(lengths, pa.int64()),
            "output_length": pa.array(9 + rows % 5, pa.int64()),
            "due_ns": pa.array((loop * n + rows) * int(1e7 / speedup), pa.int64()),
            "completion_tokens": pa.array(np.full(m, 9), pa.int64()),
            "ttft_ms": pa.array(np.where(outcome == "success", ttft, np.nan), pa.float64(), from_pandas=True),
            "tpot_ms": pa.array(tpot, pa.float64()),
            "e2e_ms": pa.array(ttft + 8 * tpot, pa.float64()),
            "ttft_from_due_ms": pa.array(ttft, pa.float64()),
            "e2el_from_due_ms": pa.array(ttft + 8 * tpot, pa.float64()),
            "itl_ms": pa.array(itl, pa.list_(pa.float32())),
            "itl_counts": pa.nulls(m, pa.list_(pa.int32())),
        }
    )


def verdicts(results) -> dict[str, str]:
    return {r.spec.name: r.verdict for r in results}


def test_a_clearly_slower_candidate_regresses_on_ttft_only():
    base, cand = run_table(1), run_table(2, ttft_scale=1.3)
    results = judge(pair(base, cand), default_spec())
    v = verdicts(results)
    assert v["ttft_p50"] == "regressed" and v["ttft_p99"] == "regressed"
    assert v["tpot_p50"] == v["itl_p50"] == v["error_rate"] == "held"
    assert v["goodput"] == "not judged"  # (no SLO given)
    assert overall(results) == "regressed"
    ttft = next(r for r in results if r.spec.name == "ttft_p50")
    assert 20 < ttft.change < 40 and ttft.low > 5 and ttft.low < ttft.change < ttft.high


def test_the_same_run_against_itself_holds_with_a_zero_interval():
    t = run_table(1)
    results = judge(pair(t, t), default_spec())
    assert overall(results) == "held"
    for r in results:
        if r.verdict != "not judged":
            assert r.change == 0 and r.low == 0 and r.high == 0, r


def test_runs_of_one_server_hold_and_a_faster_one_improves():
    base = run_table(1)
    assert overall(judge(pair(base, run_table(2)), default_spec())) == "held"
    v = verdicts(judge(pair(base, run_table(3, ttft_scale=0.7)), default_spec()))
    assert v["ttft_p50"] == "improved" and "regressed" not in v.values()


def test_pairing_removes_the_workload_pattern():
    """Rows are paired by trace identity, not by order in the file: a candidate's rows shuffled
    (as parts written out of order are) judge the same."""
    base, cand = run_table(1), run_table(2, ttft_scale=1.3)
    shuffled = cand.take(pa.array(np.random.default_rng(0).permutation(cand.num_rows)))
    a = {r.spec.name: (r.change, r.low) for r in judge(pair(base, cand), default_spec())}
    b = {r.spec.name: (r.change, r.low) for r in judge(pair(base, shuffled), default_spec())}
    assert a == b


def test_error_rate_regresses_past_its_minimum_effect():
    base, cand = run_table(1), run_table(2, failed=60)  # 10 % of the requests failed
    r = next(r for r in judge(pair(base, cand), default_spec()) if r.spec.name == "error_rate")
    assert r.verdict == "regressed" and r.change == pytest.approx(10.0) and r.low > 1.0


def test_goodput_is_judged_against_the_slo_given():
    base, cand = run_table(1), run_table(2, ttft_scale=1.3)
    r = next(r for r in judge(pair(base, cand), default_spec(), {"ttft": 70.0}) if r.spec.name == "goodput")
    assert r.verdict == "regressed" and r.spec.direction == "higher" and r.change < -5


def test_runs_of_other_slices_traces_or_schedules_cannot_be_compared():
    base = run_table(1)
    with pytest.raises(NotComparable, match="different slices.*600 requests.*500 requests"):
        pair(base, run_table(2, n=500))
    other = run_table(2, input_length=np.full(N, 7))
    with pytest.raises(NotComparable, match="different traces: .* differ in input_length"):
        pair(base, other)
    with pytest.raises(NotComparable, match="different schedules"):
        pair(base, run_table(2, speedup=2.0))
    with pytest.raises(NotComparable, match="too few requests: 50 of 50"):
        judge(pair(run_table(1, n=50), run_table(2, n=50)), default_spec())


def test_loops_pair_with_their_own_loop_and_warmup_is_left_out():
    base, cand = run_table(1, loops=2), run_table(2, loops=2)
    assert pair(base, cand).n == 2 * N
    warm = base.set_column(
        base.schema.get_field_index("warmup"), "warmup", pa.array([True] * 10 + [False] * (2 * N - 10))
    )
    with pytest.raises(NotComparable, match="different slices"):
        pair(warm, cand)


def test_a_p99_of_too_few_values_is_not_judged():
    r = next(
        r for r in judge(pair(run_table(1, n=300), run_table(2, n=300)), default_spec()) if r.spec.name == "ttft_p99"
    )
    assert r.verdict == "not judged" and "needs 500 values" in r.reason


def test_the_gate_file_overrides_metrics(tmp_path):
    f = tmp_path / "gate.yaml"
    f.write_text("confidence: 0.9\nmetrics:\n  ttft_p99: {min_effect: 50}\n  tpot_p50: off\n  e2el_p90: {}\n")
    spec = load_gate_file(str(f))
    names = [m.name for m in spec.metrics]
    assert "tpot_p50" not in names and names[-1] == "e2el_p90" and spec.confidence == 0.9
    assert next(m for m in spec.metrics if m.name == "ttft_p99").min_effect == 50
    v = verdicts(judge(pair(run_table(1), run_table(2, ttft_scale=1.3)), spec))
    assert v["ttft_p50"] == "regressed" and v["ttft_p99"] == "held"  # (+30 % is not past 50 %)
    assert metric("e2el_from_due_p99").column == "e2el_from_due_ms"


@pytest.mark.parametrize(
    "doc,error",
    [
        ({"metrics": {"ttft_p100": {}}}, "unknown metric 'ttft_p100'"),
        ({"metrics": {"ttft_p50": {"min_efect": 3}}}, "metrics.ttft_p50: unknown key"),
        ({"metrics": {"ttft_p50": {"direction": "up"}}}, "expected lower or higher"),
        ({"resamples": 10}, "resamples: 10 is out of range"),
        ({"goodput": "ttft=5"}, "goodput:"),
        ({"bootstrap": 1}, "unknown key"),
    ],
)
def test_a_bad_gate_file_is_named(doc, error):
    with pytest.raises(ValueError, match=error) as e:
        spec_from_dict(doc, "gate.yaml")
    assert str(e.value).startswith("gate.yaml")


# -- the command, on real runs ---------------------------------------------------------------


def _replay(url: str, out, *extra: str) -> None:
    cmd = [sys.executable, "-m", "replayer", "run", "--target", url, "--results", str(out), "--quiet"]
    cmd += [
        "--admin-port",
        "0",
        "--request-rate",
        "100",
        "--num-prompts",
        "220",
        "--warmup-requests",
        "20",
        "--input-len",
        "16",
    ]
    cmd += ["--output-len", "4", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def _compare(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "replayer", "compare", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_compare_gate_catches_a_slower_server_and_holds_a_run_against_itself(sim_process, tmp_path):
    fast, _ = sim_process("--ttft-base-ms", "5", "--itl-base-ms", "1", "--prefill-us-per-token", "0")
    slow, _ = sim_process("--ttft-base-ms", "300", "--itl-base-ms", "1", "--prefill-us-per-token", "0")
    _replay(fast, tmp_path / "base")
    _replay(slow, tmp_path / "cand")
    # (a busy host can make a run fall behind its trace, which the default gate refuses: that rule
    # has its own test; here the gate's verdicts are under test)
    gate = tmp_path / "gate.yaml"
    gate.write_text("require_faithful: false\n")
    md, xml = tmp_path / "gate.md", tmp_path / "gate.xml"
    p = _compare(
        str(tmp_path / "base"),
        str(tmp_path / "cand"),
        "--gate-file",
        str(gate),
        "--markdown",
        str(md),
        "--junit",
        str(xml),
    )
    assert p.returncode == 7, p.stdout + p.stderr
    assert "gate: REGRESSED (TTFT p50" in p.stdout
    assert "❌ regressed" in md.read_text() and "| TTFT p50 |" in md.read_text()
    suite = ET.parse(xml).getroot()
    assert suite.get("tests") == "10" and int(suite.get("failures")) >= 1
    assert suite.find("testcase[@name='ttft_p50']/failure") is not None
    assert suite.find("testcase[@name='goodput']/skipped") is not None

    p = _compare(str(tmp_path / "base"), str(tmp_path / "base"), "--gate-file", str(gate), "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "held" and doc["paired_requests"] == 200

    _replay(fast, tmp_path / "other", "--input-len", "24")  # another workload
    p = _compare(str(tmp_path / "base"), str(tmp_path / "other"), "--gate-file", str(gate))
    assert p.returncode == 2 and "cannot compare: different traces" in p.stderr


def test_compare_gate_names_a_folder_that_is_not_a_run(tmp_path):
    (tmp_path / "empty").mkdir()
    p = _compare(str(tmp_path / "empty"), str(tmp_path / "empty"), "--gate")
    assert p.returncode == 2 and "not a results folder" in p.stderr
    p = _compare(str(tmp_path / "empty"), str(tmp_path / "empty"), "--junit", "x.xml")
    assert p.returncode == 2 and "need --gate" in p.stderr


def test_a_run_that_fell_behind_its_trace_is_not_compared():
    from replayer.results.gateout import unfaithful

    assert unfaithful("baseline", {"dispatch_lag_p99_ms": 3.0}) is None
    assert "dispatch lag p99 80.0 ms" in unfaithful("baseline", {"dispatch_lag_p99_ms": 80.0})
    verdict = {"verdict": "not_faithful", "reasons": ["held back by --max-concurrency 4"]}
    assert "--max-concurrency 4" in unfaithful("candidate", {"fidelity": verdict, "dispatch_lag_p99_ms": 1.0})
    assert unfaithful("candidate", {"fidelity": {"verdict": "faithful"}, "dispatch_lag_p99_ms": 80.0}) is None


def test_the_gate_file_may_compare_runs_that_fell_behind(tmp_path):
    spec = spec_from_dict({"require_faithful": False, "max_dispatch_lag_ms": 100}, "g.yaml")
    assert (spec.require_faithful, spec.max_dispatch_lag_ms) == (False, 100.0)
    with pytest.raises(ValueError, match="require_faithful: expected true or false"):
        spec_from_dict({"require_faithful": "no"}, "g.yaml")


def _stalled(t: pa.Table, rows: slice, factor: float = 4.0) -> pa.Table:
    """``t`` with every 20th ITL gap of the requests at ``rows`` (pair order) ``factor`` times
    longer: a stall's tail, as a host's other work makes it."""
    itl = t.column("itl_ms").to_pylist()
    for i in range(*rows.indices(len(itl))):
        if i % 20 < 3:
            itl[i] = [g * factor for g in itl[i]]
    return t.set_column(t.column_names.index("itl_ms"), "itl_ms", pa.array(itl, pa.list_(pa.float32())))


def test_a_tail_that_moved_in_one_half_of_the_run_is_a_transient_and_holds():
    base = run_table(1)
    spec = spec_from_dict({"metrics": {"itl_p99": {"min_effect": 30}}}, "g.yaml")
    once = {r.spec.name: r for r in judge(pair(base, _stalled(run_table(2), slice(N // 2, N))), spec)}
    assert once["itl_p99"].verdict == "held" and "held as a possible transient" in once["itl_p99"].reason
    assert once["itl_p99"].change > 30 and once["itl_p99"].low > 30  # (the whole-run interval alone would fail it)
    always = {r.spec.name: r for r in judge(pair(base, _stalled(run_table(2), slice(0, N))), spec)}
    assert always["itl_p99"].verdict == "regressed" and always["itl_p99"].reason == ""


def test_a_run_its_own_client_slowed_is_judged_on_its_medians_not_its_tails():
    from replayer.results.gatestall import client_late

    late = {"verdict": "not_faithful", "reasons": ["dispatch lag p99 34.9 ms above the bound 25 ms"]}
    why = client_late("candidate", {"fidelity": {**late, "dispatch_lag_ms": {"p99": 34.9}}}, 25.0, 100.0)
    assert why is not None and "dispatch lag p99 34.9 ms" in why
    assert client_late("candidate", {"dispatch_lag_p99_ms": 34.9}, 25.0, 100.0) is not None
    assert client_late("candidate", {"dispatch_lag_p99_ms": 1340.0}, 25.0, 1000.0) is None  # (too late: refused)
    assert client_late("candidate", {"dispatch_lag_p99_ms": 3.0}, 25.0, 100.0) is None  # (on time)
    capped = {"verdict": "not_faithful", "reasons": [*late["reasons"], "held back by --max-concurrency 4"]}
    assert client_late("candidate", {"fidelity": capped, "dispatch_lag_p99_ms": 34.9}, 25.0, 100.0) is None
    base, cand = run_table(1), run_table(2, ttft_scale=1.3)
    v = {r.spec.name: r for r in judge(pair(base, cand), default_spec(), slowed=why)}
    assert v["ttft_p50"].verdict == "regressed"
    assert v["ttft_p99"].verdict == "not judged" and "dispatch lag p99 34.9 ms" in v["ttft_p99"].reason
