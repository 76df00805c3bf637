"""`replayer report` (HTML with plots, drawn in headless Chromium) and `replayer compare`."""

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from conftest import SLICE_10MIN

from replayer.cli import main as cli_main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A real run: 200 requests of the committed slice against the embedded simulator."""
    d = tmp_path_factory.mktemp("run") / "res"
    out = subprocess.run([sys.executable, "-m", "replayer", "run", str(SLICE_10MIN), "--max-requests", "200",
                          "--speedup", "20", "--results", str(d), "--admin-port", "0", "--quiet"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return d


def _with_target_metrics(src, dst):
    shutil.copytree(src, dst)
    pd.DataFrame({"t_s": [0.0, 1.0, 2.0, 0.0, 1.0, 2.0],
                  "name": ["vllm:num_requests_running"] * 3 + ["vllm:kv_cache_usage_perc"] * 3,
                  "value": [1, 5, 3, 0.1, 0.4, 0.3]}).to_parquet(dst / "target_metrics.parquet")
    return dst


def _dump_dom(html_path) -> str:
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                              "--disable-background-networking", "--disable-component-update", "--disable-sync",
                              "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=10000",
                              "--dump-dom", f"file://{html_path}"], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_report_cli_writes_self_contained_html(results, tmp_path, capsys):
    target_run = _with_target_metrics(results, tmp_path / "with_target")
    assert cli_main(["report", str(target_run), "-o", str(tmp_path / "r.html")]) == 0
    text = (tmp_path / "r.html").read_text()
    assert "<script src=" not in text and "cdn." not in text.split("</script>")[0][:200]  # plotly.js inline
    for title in ("Arrivals: due vs sent vs completed", "Latency over time", "Latency CDFs", "Token throughput",
                  "Dispatch lag", "Target server metrics"):
        assert title in text, title
    assert "mean_ttft_ms" in text  # the summary table
    capsys.readouterr()
    assert cli_main(["report", str(tmp_path / "nothing")]) == 2
    assert "no results files (requests*.parquet)" in capsys.readouterr().err
    assert cli_main(["report", str(target_run), "-o", str(tmp_path / "no" / "r.html")]) == 2  # no traceback
    assert "cannot write the report" in capsys.readouterr().err
    # a --workers folder: its results are in worker-i/, rolled or not
    from replayer.report import load_results

    w = tmp_path / "w"
    for i, name in enumerate(("requests.parquet", "requests-00000.parquet")):
        (w / f"worker-{i}").mkdir(parents=True)
        shutil.copy(Path(results) / "requests.parquet", w / f"worker-{i}" / name)
    df, _, _ = load_results(str(w))
    assert len(df) == 2 * len(load_results(str(results))[0])
    assert cli_main(["report", str(w), "-o", str(tmp_path / "w.html")]) == 0


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium; .ci/run installs it)")
def test_report_plots_draw_in_headless_chromium(results, tmp_path):
    from replayer.report import write_report

    run = _with_target_metrics(results, tmp_path / "with_target")
    path = write_report(str(run), str(tmp_path / "report.html"))
    dom = _dump_dom(path)
    figs = re.findall(r'<div id="fig\d+" class="plotly-graph-div js-plotly-plot"', dom)
    assert len(figs) == 6, len(figs)  # plotly turned every div into a plot
    assert dom.count('class="main-svg"') >= 2 * 6
    # every trace of every figure drew: lines as paths, scatter points as markers
    assert len(re.findall(r'class="trace scatter', dom)) >= 14
    assert dom.count('class="point"') >= 200
    assert dom.count('class="js-line"') >= 10


def test_compare_text_and_json(results, tmp_path, capsys):
    b = tmp_path / "b"
    b.mkdir()
    s = json.loads((results / "summary.json").read_text())
    s2 = dict(s, p99_ttft_ms=(s["p99_ttft_ms"] or 1.0) * 2, failed=s["failed"] + 3,
              errors_by_kind={"timeout": 3})
    (b / "summary.json").write_text(json.dumps(s2))
    capsys.readouterr()
    assert cli_main(["compare", str(results), str(b)]) == 0
    out = capsys.readouterr()
    line = next(l for l in out.out.splitlines() if l.startswith("TTFT p99"))
    assert "+100.0%" in line and line.rstrip().endswith("A")
    assert "errors: timeout" in out.out and "not the same experiment" not in out.out
    assert cli_main(["compare", str(results), str(b / "summary.json"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["setup_differences"] == []
    rows = {r["key"]: r for r in got["rows"]}
    assert rows["failed"]["diff"] == 3 and rows["failed"]["better"] == "a"
    assert rows["p99_ttft_ms"]["pct"] == pytest.approx(100.0)
    assert rows["errors_by_kind.timeout"]["b"] == 3
    # another size and speed-up: said before the table, and in the JSON
    (b / "summary.json").write_text(json.dumps(dict(s2, scheduled=s["scheduled"] * 2, speedup=s["speedup"] * 4)))
    assert cli_main(["compare", str(results), str(b)]) == 0
    out = capsys.readouterr().out
    assert "the runs are not the same experiment:" in out.split("metric")[0]
    assert f"requests scheduled: {s['scheduled']} in A, {s['scheduled'] * 2} in B" in out
    assert f"speed-up: {s['speedup']} in A, {s['speedup'] * 4} in B" in out
    assert cli_main(["compare", str(results), str(b), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["setup_differences"]) == 2
    killed = tmp_path / "killed"  # a SIGKILLed run leaves results files and no summary.json
    killed.mkdir()
    shutil.copy(results / "requests.parquet", killed / "requests.parquet")
    assert cli_main(["compare", str(results), str(killed), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    rows = {r["key"]: r for r in got["rows"]}
    assert rows["completed"]["a"] == rows["completed"]["b"] == s["completed"]
    # its setup comes from the results file's metadata (same trace, speed-up, ...): only the cut
    assert got["setup_differences"] == ["B was cut short (by a kill (no summary.json)): its numbers cover "
                                        "part of its run"]
    # two runs on the embedded simulator (a free port each) are not told apart by their target
    (b / "summary.json").write_text(json.dumps(dict(s, target="http://127.0.0.1:1")))
    assert cli_main(["compare", str(results), str(b), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup_differences"] == [] and s["target_embedded"] is True
    (b / "summary.json").write_text(json.dumps(dict(s, target="http://127.0.0.1:1", target_embedded=False)))
    assert cli_main(["compare", str(results), str(b), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup_differences"][0].startswith("target: ")
    assert cli_main(["compare", str(results), str(tmp_path / "nope")]) == 2
    (tmp_path / "empty.json").write_text("{}")
    capsys.readouterr()
    for wrong in (str(results / "requests.parquet"), str(tmp_path / "empty.json")):  # not a summary
        assert cli_main(["compare", str(results), wrong]) == 2
        assert f"{wrong}: not a" in capsys.readouterr().err
