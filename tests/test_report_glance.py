"""The report at a glance (issue 47): one verdict line at the top, log axes labelled at each
decade, charts only for what the run had, loop boundaries on the time axes, and a page that
does not carry plotly's library (one copy beside it, so it still opens offline)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd

from replayer.results.report import draw, figure_specs, target_specs, write_report
from replayer.results.reportdata import load_results
from replayer.results.reportmarks import add_marks, run_marks
from replayer.results.reportparts import PLOTLY_FILE, axis_layout, drop_empty, verdict_parts


def test_the_verdict_parts_say_whether_the_run_was_good():
    good = {"completed": 200, "failed": 0, "goodput_slos_ms": {"ttft": 500}, "slo_attainment": 0.97}
    assert verdict_parts(good) == [("200 of 200 requests succeeded", True), ("SLO attainment 97.0%", True)]
    bad = {"completed": 0, "failed": 9, "nothing_measured": "all 9 failed", "stop_signal": "SIGTERM"}
    assert verdict_parts(bad) == [
        ("nothing measured: every request that ended failed", False),
        ("stopped early (SIGTERM)", None),
    ]
    with_sections = {"completed": 5, "failed": 1, "fidelity": {"verdict": "ok"}, "drift": {"status": "drifted"}}
    assert verdict_parts(with_sections) == [
        ("5 of 6 requests succeeded", False),
        ("fidelity: ok", True),
        ("drift: drifted", False),
    ]


def test_log_axes_are_labelled_at_each_decade():
    assert axis_layout("log")["dtick"] == 1 and axis_layout("linear") == {"type": "linear"}
    [(_, fig)] = draw(
        [{"title": "t", "x_title": "s", "y_title": "f", "x_type": "log", "y_type": "linear",
          "series": [{"name": "a", "mode": "lines", "line_shape": "linear", "x": np.array([0.01, 10.0]), "y": np.array([0, 1])}]}]
    )  # fmt: skip
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis.dtick == 1


def test_a_chart_only_for_what_the_run_had():
    rows = []
    for i, t in enumerate((100.0, 101.0, 102.0)):
        rows += [
            {"time_s": t, "metric": "vllm:mm_cache_queries_total", "labels": "", "kind": "counter", "value": 0.0},
            {"time_s": t, "metric": "vllm:mm_cache_hits_total", "labels": "", "kind": "counter", "value": 0.0},
            {"time_s": t, "metric": "vllm:num_requests_running", "labels": "", "kind": "gauge", "value": float(i)},
            {"time_s": t, "metric": "vllm:num_requests_waiting", "labels": "", "kind": "gauge", "value": 0.0},
        ]
    specs = target_specs(pd.DataFrame(rows))
    assert any("mm_cache" in se["name"] for sp in specs for se in sp["series"])  # (drawn before)
    kept = drop_empty(specs)
    assert not any("mm_cache" in se["name"] for sp in kept for se in sp["series"])
    [requests] = [sp for sp in kept if sp["y_title"] == "requests"]
    assert len(requests["series"]) == 2  # (a zero series beside a live one stays)


def test_a_looped_runs_report_marks_the_loops_shares_plotly_and_opens_with_its_verdict(
    tmp_path, mooncake_slice, sim_process
):
    trace = mooncake_slice(10)
    url, _ = sim_process("--itl-base-ms", "1")
    res = tmp_path / "r"
    p = subprocess.run(
        [
            sys.executable, "-m", "replayer", "run", str(trace), "--target", url, "--speedup", "20", "--loop", "2",
            "--results", str(res), "--admin-port", "0", "--quiet", "--goodput", "ttft:60000",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    data, summary, _ = load_results(str(res))
    assert sorted(data.loop_starts) == [0, 1]
    specs = {sp["title"]: sp for sp in figure_specs(data)}
    add_marks(list(specs.values()), [m for m in run_marks(summary, data.loop_starts, None) if m.kind == "loop"])
    [mark] = specs["Arrivals: due vs sent vs completed"]["marks"]
    assert mark.label == "loop 1" and mark.x == data.loop_starts[1] > 0
    assert "marks" not in specs["Latency CDFs"]  # (not a time axis)
    page = write_report(str(res))
    other = write_report(str(res), str(res / "again.html"))
    html = open(page, encoding="utf-8").read()
    assert f'src="{PLOTLY_FILE}"' in html and "Plotly" not in html.split("<body>")[0].replace(PLOTLY_FILE, "")
    assert (res / PLOTLY_FILE).stat().st_size > 1_000_000 and len(list(res.glob("*.js"))) == 1
    assert len(html.encode()) < 1_500_000 and open(other, encoding="utf-8").read().count(PLOTLY_FILE) == 1
    top = html.split("<body>", 1)[1]
    n = json.loads((res / "summary.json").read_text())["completed"]
    assert top.index("Verdict:") < top.index("<section") and f"{n:,} of {n:,} requests succeeded" in top
    assert "SLO attainment 100.0%" in top
