"""``replayer history`` (issue 45): runs and a soak's loops over time, their headline numbers and
verdicts, as a table, JSON and an HTML page; the rows are tested on real results folders."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import wait_http, wait_sim_url

from replayer.results.history import format_history, history, history_specs, run_folders


def _replay(url: str, out, *extra: str) -> None:
    cmd = [sys.executable, "-m", "replayer", "run", "--target", url, "--results", str(out), "--quiet"]
    cmd += [
        "--admin-port",
        "0",
        "--request-rate",
        "200",
        "--num-prompts",
        "40",
        "--input-len",
        "16",
        "--output-len",
        "4",
    ]
    p = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two nightly runs and a soak of three loops, against one simulator (made once: the tests
    only read them, but one of them rewrites a summary.json it made a copy of)."""
    tmp = tmp_path_factory.mktemp("history")
    err = tmp / "sim.stderr"
    with open(err, "wb") as fh:
        sim = subprocess.Popen(
            [sys.executable, "-m", "replayer", "sim", "--port", "0", "--ttft-base-ms", "5", "--itl-base-ms", "1"],
            stderr=fh,
        )
    try:
        url = wait_sim_url(sim, err)
        wait_http(url + "/health")
        _replay(url, tmp / "nightly" / "one", "--goodput", "ttft:1000")
        _replay(url, tmp / "nightly" / "two")
        _replay(url, tmp / "soak", "--loop", "3")
    finally:
        sim.terminate()
        sim.wait(30)
    return tmp


def test_history_lists_runs_in_time_order_and_a_soak_loop_by_loop(runs):
    rows = history([str(runs / "nightly"), str(runs / "soak")])
    assert [(r["run"], r["loop"]) for r in rows] == [
        ("one", None),
        ("two", None),
        ("soak", 0),
        ("soak", 1),
        ("soak", 2),
    ]
    assert [r["start"] for r in rows] == sorted(r["start"] for r in rows)
    assert all(r["requests"] == 40 and r["error_rate"] == 0 and r["median_ttft_ms"] > 0 for r in rows)
    assert rows[0]["slo_attainment"] == 1.0 and rows[1]["slo_attainment"] is None
    assert [r["loop"] for r in history([str(runs / "soak")], by_run=True)] == [None]
    text = format_history(rows)
    assert text.splitlines()[0].split()[:4] == ["start", "(UTC)", "run", "loop"] and "100.0%" in text
    specs = history_specs(rows)
    assert [len(s["series"][0]["y"]) for s in specs] == [5, 5]


def test_history_reads_the_verdict_sections_of_a_summary(runs, tmp_path):
    shutil.copytree(runs / "nightly", tmp_path / "nightly")
    runs = tmp_path
    path = runs / "nightly" / "two" / "summary.json"
    s = json.loads(path.read_text())
    s["fidelity"] = {"verdict": "not_faithful", "reasons": ["x"]}
    s["drift"] = {"verdict": "stable"}
    path.write_text(json.dumps(s))
    row = next(r for r in history([str(runs / "nightly")]) if r["run"] == "two")
    assert (row["fidelity"], row["drift"]) == ("not_faithful", "stable")
    assert "fidelity not_faithful, drift stable" in format_history([row])


def test_history_command_draws_the_page_and_names_a_wrong_folder(runs, tmp_path):
    page = tmp_path / "history.html"
    cmd = [sys.executable, "-m", "replayer", "history", str(runs / "nightly"), str(runs / "soak"), "--html", str(page)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "Latency per run" in page.read_text() and "plotly" in page.read_text()
    assert len(p.stdout.splitlines()) >= 7
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="neither a results folder"):
        run_folders([str(tmp_path / "empty")])
    p = subprocess.run(
        [sys.executable, "-m", "replayer", "history", str(tmp_path / "nope")], capture_output=True, text=True
    )
    assert p.returncode == 2 and "no such folder" in p.stderr
