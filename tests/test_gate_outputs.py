"""The regression gate's outputs as a CI job meets them (issue 45): output paths in folders not
made yet or that cannot be written, every output written when the runs are not compared, the
warnings (a run compared though not faithful, a run its own host slowed, other --goodput
bounds) in every output, damaged inputs named, and the reasons' wording. The command runs on
real replays of a small trace against the embedded simulator."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from conftest import wait_http, wait_sim_url

from replayer.results.gatespec import spec_from_dict
from replayer.results.gatestall import transient

ROWS = 120


def _trace(path, extra_input: int = 0) -> None:
    """A trace of ``ROWS`` requests 10 ms apart (1.2 s), short prompts and answers."""
    with open(path, "w") as f:
        for i in range(ROWS):
            row = {"timestamp": 10 * i, "input_length": 40 + i % 7 + extra_input, "output_length": 4, "hash_ids": [i]}
            f.write(json.dumps(row) + "\n")


def _replay(url: str, trace, out, *extra: str) -> None:
    cmd = [sys.executable, "-m", "replayer", "run", str(trace), "--target", url, "--results", str(out)]
    cmd += ["--quiet", "--admin-port", "0", "--no-scrape-target-metrics", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Against one simulator: ``base`` (--goodput ttft:1000), ``bounds`` (the same trace,
    --goodput ttft:2000), ``other`` (another trace file, other prompt lengths at the same rows)
    and ``fast`` (the same trace at --speedup 2). The tests read them (copies where they edit)."""
    tmp = tmp_path_factory.mktemp("gateux")
    _trace(tmp / "t1.jsonl")
    _trace(tmp / "t2.jsonl", extra_input=8)
    err = tmp / "sim.stderr"
    with open(err, "wb") as fh:
        sim = subprocess.Popen(
            [sys.executable, "-m", "replayer", "sim", "--port", "0", "--ttft-base-ms", "5", "--itl-base-ms", "1"],
            stderr=fh,
        )
    try:
        url = wait_sim_url(sim, err)
        wait_http(url + "/health")
        _replay(url, tmp / "t1.jsonl", tmp / "base", "--goodput", "ttft:1000")
        _replay(url, tmp / "t1.jsonl", tmp / "bounds", "--goodput", "ttft:2000")
        _replay(url, tmp / "t2.jsonl", tmp / "other")
        _replay(url, tmp / "t1.jsonl", tmp / "fast", "--speedup", "2")
    finally:
        sim.terminate()
        sim.wait(30)
    # (a busy host can make a run fall behind its trace, which the default gate refuses: the
    # outputs are under test here, so the gate compares such runs, with a warning)
    (tmp / "loose.yaml").write_text("require_faithful: false\n")
    return tmp


def _said(warnings: list[str], part: str) -> str:
    """The one warning saying ``part`` (a busy host may add one of a run that fell behind)."""
    (said,) = [w for w in warnings if part in w]
    return said


def _gate(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "replayer", "compare", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _outputs(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, str, ET.Element, dict]:
    """``compare ARGS --markdown --junit --json`` into folders not made yet: (process, Markdown,
    JUnit root, JSON)."""
    md, xml = tmp_path / "reports" / "md" / "gate.md", tmp_path / "reports" / "gate.xml"
    p = _gate(*args, "--markdown", md, "--junit", xml, "--json")
    assert "Traceback" not in p.stderr, p.stderr
    return p, md.read_text(), ET.parse(xml).getroot(), json.loads(p.stdout)


def _conform(root: ET.Element) -> None:
    """The JUnit counts agree with the test cases (what a CI system reads)."""
    cases = root.findall("testcase")
    assert int(root.get("tests")) == len(cases)
    assert int(root.get("failures")) == len(root.findall("testcase/failure"))
    assert int(root.get("errors")) == len(root.findall("testcase/error"))
    assert int(root.get("skipped")) == len(root.findall("testcase/skipped"))


def test_outputs_go_to_folders_made_for_them_and_a_path_that_is_a_folder_is_named(runs, tmp_path):
    p, md, root, doc = _outputs(tmp_path, runs / "base", runs / "base", "--gate-file", runs / "loose.yaml")
    assert p.returncode == 0, p.stderr
    assert "✅ held" in md and doc["verdict"] == "held" and root.get("failures") == "0"
    _conform(root)
    loose = ("--gate-file", runs / "loose.yaml")
    p = _gate(runs / "base", runs / "base", *loose, "--junit", tmp_path, "--markdown", tmp_path / "ok.md")
    assert p.returncode == 5, p.stdout + p.stderr  # (held, but an output asked for is missing)
    assert f"{tmp_path}: cannot write the JUnit XML there: it is a folder" in p.stderr
    assert "gate: HELD" in p.stdout and (tmp_path / "ok.md").exists() and "Traceback" not in p.stderr
    (tmp_path / "file").write_text("x")
    p = _gate(runs / "base", runs / "other", "--gate", "--markdown", tmp_path / "file" / "gate.md")
    assert p.returncode == 2 and "file/gate.md: cannot write the Markdown" in p.stderr  # (not compared: its code kept)


def test_a_regression_keeps_its_exit_code_when_an_output_cannot_be_written(runs, tmp_path):
    """The candidate: the baseline's own requests with every TTFT (and so E2E) doubled."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    shutil.copytree(runs / "base", tmp_path / "slower")
    path = tmp_path / "slower" / "requests.parquet"
    t = pq.read_table(path)
    for col in ("ttft_ms", "e2e_ms"):
        i = t.schema.get_field_index(col)
        t = t.set_column(i, t.schema.field(i), pc.multiply(t.column(col), 2.0))
    pq.write_table(t, path)
    p = _gate(runs / "base", tmp_path / "slower", "--gate-file", runs / "loose.yaml", "--junit", tmp_path)
    assert p.returncode == 7 and "gate: REGRESSED (TTFT p50" in p.stdout, p.stdout + p.stderr
    assert "cannot write the JUnit XML there" in p.stderr


def test_runs_not_compared_still_write_every_output_saying_why(runs, tmp_path):
    stale = tmp_path / "reports" / "md" / "gate.md"
    stale.parent.mkdir(parents=True)
    stale.write_text("## replayer gate: ✅ held (yesterday's)\n")
    p, md, root, doc = _outputs(tmp_path, runs / "base", runs / "other", "--gate-file", runs / "loose.yaml")
    assert p.returncode == 2, p.stderr
    assert doc["verdict"] == "not_compared" and doc["metrics"] == []
    reason = doc["reason"]
    assert reason.startswith("different traces: ") and "t1.jsonl" in reason and "t2.jsonl" in reason
    assert "not compared" in md and reason in md and "yesterday" not in md
    _conform(root)
    error = root.find("testcase[@name='comparison']/error")
    assert root.get("errors") == "1" and error is not None and reason in error.get("message")
    p, md, root, doc = _outputs(tmp_path, runs / "base", runs / "fast", "--gate")
    assert p.returncode == 2 and doc["reason"] == "different speed-ups: 1.0 in the baseline, 2.0 in the candidate"


def test_other_goodput_bounds_are_said_and_judged_by_one_set(runs, tmp_path):
    loose = ("--gate-file", runs / "loose.yaml")
    p, md, root, doc = _outputs(tmp_path, runs / "base", runs / "bounds", *loose)
    assert p.returncode in (0, 7), p.stderr  # (two runs: a busy host may move one; the bounds are under test)
    assert doc["goodput_slos_ms"] == {"ttft": 1000.0} and doc["goodput_slos_from"] == "the baseline's --goodput"
    warning = _said(doc["warnings"], "--goodput")
    assert "ttft:1000 in the baseline, ttft:2000 in the candidate" in warning and "judged by ttft:1000" in warning
    assert warning in md and warning in root.find("system-err").text
    assert warning in [e.get("value") for e in root.findall("properties/property[@name='warning']")]
    p = _gate(runs / "base", runs / "bounds", *loose)
    assert "goodput judged by ttft:1000 (ms) in both runs, from the baseline's --goodput" in p.stdout
    gate = tmp_path / "gate.yaml"
    gate.write_text("goodput: {ttft: 1500}\nrequire_faithful: false\n")  # (the mapping form a --config file takes)
    p, md, root, doc = _outputs(tmp_path, runs / "base", runs / "bounds", "--gate-file", gate)
    assert doc["goodput_slos_ms"] == {"ttft": 1500.0} and f"the gate file {gate}" in doc["goodput_slos_from"]
    p = _gate(runs / "base", runs / "bounds")
    assert p.returncode == 0 and "not the same experiment" in p.stdout, p.stderr
    assert "--goodput bounds (ms): ttft:1000 in A, ttft:2000 in B" in p.stdout


def _with_fidelity(src, dst, fidelity: dict):
    shutil.copytree(src, dst)
    s = json.loads((dst / "summary.json").read_text())
    (dst / "summary.json").write_text(json.dumps({**s, "fidelity": fidelity}))
    return dst


def test_a_run_compared_though_not_faithful_or_slowed_by_its_host_is_said_in_every_output(runs, tmp_path):
    capped = _with_fidelity(
        runs / "base", tmp_path / "capped", {"verdict": "not_faithful", "reasons": ["held back by --max-concurrency 4"]}
    )
    p, md, root, doc = _outputs(tmp_path, runs / "base", capped, "--gate-file", runs / "loose.yaml")
    assert p.returncode == 0, p.stderr
    warning = _said(doc["warnings"], "--max-concurrency 4")
    assert "the candidate was not faithful to its trace: held back by --max-concurrency 4" in warning
    assert warning in md and warning in root.find("system-err").text and warning in p.stderr
    p, md, root, doc = _outputs(tmp_path, runs / "base", capped, "--gate")  # (the default refuses it)
    assert p.returncode == 2 and "not faithful" in doc["reason"] and doc["reason"] in md
    late = {"verdict": "not_faithful", "reasons": ["dispatch lag p99 34.9 ms above the bound 25 ms"]}
    slowed = _with_fidelity(runs / "base", tmp_path / "slowed", {**late, "dispatch_lag_ms": {"p99": 34.9}})
    p, md, root, doc = _outputs(tmp_path, slowed, runs / "base", "--gate-file", runs / "loose.yaml")
    assert p.returncode == 0, p.stderr
    warning = _said(doc["warnings"], "the baseline fell behind")
    assert "the baseline fell behind its trace, dispatch lag p99 34.9 ms: its own host slowed it" in warning
    assert warning in md and warning in root.find("system-err").text


def test_damaged_inputs_are_named(runs, tmp_path):
    shutil.copytree(runs / "base", tmp_path / "damaged")
    results = tmp_path / "damaged" / "requests.parquet"
    with open(results, "r+b") as f:
        f.seek(max(0, results.stat().st_size - 200))
        f.write(b"\0" * 200)
    p = _gate(tmp_path / "damaged", runs / "base", "--gate")
    assert p.returncode == 2 and f"{results}: damaged results file" in p.stderr, p.stderr
    shutil.copytree(runs / "base", tmp_path / "nosummary")
    summary = tmp_path / "nosummary" / "summary.json"
    summary.write_text('{"completed": 1')
    for cmd in (("compare", tmp_path / "nosummary", runs / "base", "--gate"), ("history", tmp_path / "nosummary")):
        p = subprocess.run([sys.executable, "-m", "replayer", *map(str, cmd)], capture_output=True, text=True)
        assert p.returncode == 2 and f"{summary}: not a summary.json (not JSON)" in p.stderr, (cmd, p.stderr)
    gate = tmp_path / "gate.yaml"
    gate.write_bytes(b"\x89PNG\r\n\x1a\n\0\0\xff")
    p = _gate(runs / "base", runs / "base", "--gate-file", gate)
    assert p.returncode == 2 and f"{gate}: not a gate file" in p.stderr


def test_history_draws_into_a_folder_made_for_it_and_names_a_path_it_cannot_write(runs, tmp_path):
    page = tmp_path / "out" / "h.html"
    cmd = [sys.executable, "-m", "replayer", "history", str(runs / "base")]
    p = subprocess.run([*cmd, "--html", str(page)], capture_output=True, text=True)
    assert p.returncode == 0 and "plotly" in page.read_text(), p.stderr
    p = subprocess.run([*cmd, "--html", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 5 and f"{tmp_path}: cannot write the HTML page there" in p.stderr
    assert "base" in p.stdout and "Traceback" not in p.stderr  # (the table printed all the same)


def test_a_change_in_one_half_is_said_as_observed_not_as_a_cause():
    why = transient((28.0, 14.0), 20.0, "lower")
    assert why == (
        "past the minimum effect +20% in the first half only: first half +28.0%, second half +14.0%; "
        "held as a possible transient"
    )
    assert "(" not in why and "stall" not in why
    assert "the second half only" in transient((5.0, -30.0), 20.0, "higher")
    assert "neither half alone" in transient((15.0, 18.0), 20.0, "lower")
    assert transient((25.0, 30.0), 20.0, "lower") is None


def test_a_gate_file_takes_goodput_as_a_mapping_and_metrics_may_be_disabled():
    spec = spec_from_dict({"goodput": {"ttft": 240, "e2el": 20000}, "metrics": {"tpot_p50": {"enabled": False}}}, "g")
    assert spec.goodput == "ttft:240,e2el:20000" and "tpot_p50" not in [m.name for m in spec.metrics]
    with pytest.raises(ValueError, match="g: goodput: .*unknown key 'ttfb'"):
        spec_from_dict({"goodput": {"ttfb": 240}}, "g")
