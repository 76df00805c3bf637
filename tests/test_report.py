"""`replayer report` (HTML with plots, drawn in headless Chromium) and `replayer compare`."""

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import SLICE_10MIN

from replayer.cli import main as cli_main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A real run: 200 requests of the committed slice against the embedded simulator, each
    response at most 64 tokens (the slice's longest, 929 tokens 10 ms apart, would hold the run's
    end ~9 s after its last request)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("run") / "res"
    trace = pq.read_table(SLICE_10MIN)
    short = pc.min_element_wise(trace.column("output_length"), 64).cast(trace.schema.field("output_length").type)
    trace = trace.set_column(trace.schema.get_field_index("output_length"), "output_length", short)
    pq.write_table(trace, d.parent / "slice.parquet")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(d.parent / "slice.parquet"),
            "--max-requests",
            "200",
            "--speedup",
            "20",
            "--results",
            str(d),
            "--admin-port",
            "0",
            "--quiet",
            "--scrape-interval",
            "1",
            "--goodput",
            "ttft:60000",
            "e2el:600000",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return d


def test_report_figures_show_the_runs_data(results):
    """What each plot shows, without a browser: the data behind the figures (``figure_specs``)
    of a real run on the embedded simulator, whose /metrics were scraped every second."""
    import numpy as np

    from replayer.observe import read_samples
    from replayer.results.report import figure_specs
    from replayer.results.reportdata import axis_origin_wall_s, load_results

    df, summary, _ = load_results(str(results))
    target = read_samples(str(results)).to_pandas()
    specs = {sp["title"]: sp for sp in figure_specs(df, target, axis_origin_wall_s(str(results)))}
    arrivals = specs["Arrivals: due vs sent vs completed"]
    assert [se["name"] for se in arrivals["series"]] == ["due (schedule)", "sent", "completed"]
    assert arrivals["y_title"] == "requests/s"
    bin_s = np.diff(arrivals["series"][0]["x"][:2])[0]
    for se in arrivals["series"]:  # each line integrates to its number of requests
        assert round(float(se["y"].sum() * bin_s)) == len(df) == summary["completed"]
    lat = specs["Latency over time (successful requests)"]
    assert [se["name"] for se in lat["series"]] == ["TTFT", "E2E"] and lat["y_title"] == "seconds"
    assert len(lat["series"][0]["x"]) == summary["completed"]
    # the summary's median is the nearest rank (ceil(n/2)-th smallest), not the mean of the two
    # middle values: on a busy host those two can differ by more than a percent
    ttft = np.sort(np.asarray(lat["series"][0]["y"], dtype=float))
    ttft = ttft[~np.isnan(ttft)]
    assert ttft[int(np.ceil(ttft.size / 2)) - 1] * 1e3 == pytest.approx(summary["median_ttft_ms"], rel=0.01)
    cdf = specs["Latency CDFs"]
    assert [se["name"] for se in cdf["series"]] == [
        "TTFT",
        "E2E",
        "TPOT",
        "ITL (token-weighted)",
        "TTFT from the due time",
        "E2E from the due time",
    ]
    assert all(se["y"][-1] == 1.0 for se in cdf["series"])
    for se, key in zip(cdf["series"][4:], ("max_ttft_from_due_ms", "max_e2el_from_due_ms")):
        assert se["x"][-1] * 1e3 == pytest.approx(summary[key])
    # the target's metrics: one line per metric (not t_ns and value), one figure per unit
    names = {se["name"] for sp in specs.values() for se in sp["series"]}
    assert not names & {"t_ns", "time_s", "value", "labels"}
    running = specs["Target server metrics: requests"]
    assert {se["name"] for se in running["series"]} == {"vllm:num_requests_running", "vllm:num_requests_waiting"}
    scrapes = target["time_s"].nunique()
    assert scrapes >= 3 and all(len(se["x"]) == scrapes for se in running["series"])
    assert max(se["y"].max() for se in running["series"]) > 0  # the server was busy
    rates = {se["name"]: se for se in specs["Target server metrics: tokens/s"]["series"]}
    assert {"vllm:prompt_tokens", "vllm:generation_tokens"} <= set(rates)
    for name, key in (("vllm:prompt_tokens", "prompt_tokens"), ("vllm:generation_tokens", "generation_tokens")):
        se = rates[name]  # the rate over each interval, times the intervals, is the run's increase
        dt = np.diff(np.sort(target.loc[target["metric"] == name + "_total", "time_s"].unique()))
        assert len(se["x"]) == scrapes - 1
        assert float((se["y"] * dt).sum()) == pytest.approx(summary["target_metrics"]["deltas"][key])
    # on the requests' time axis: seconds after the run's start, not Unix time or ns
    assert max(se["x"].max() for se in running["series"]) < summary["duration"] + 30


def test_target_figures_keep_request_and_token_counters_apart_and_name_every_line():
    """vllm:request_success (a few per second) shared a linear axis with the prefix-cache counters
    (thousands of tokens per second) and read as 0; a figure of one line had no legend."""
    import pandas as pd

    from replayer.results.report import draw, target_specs

    rows = []
    for i in range(3):
        for metric, per_s in (
            ("vllm:request_success_total", 2),
            ("vllm:num_preemptions_total", 1),
            ("vllm:prefix_cache_queries_total", 5000),
            ("vllm:prefix_cache_hits_total", 3000),
            ("vllm:prompt_tokens_total", 5000),
        ):
            rows.append({"time_s": 100.0 + i, "metric": metric, "kind": "counter", "value": per_s * i})
        rows.append({"time_s": 100.0 + i, "metric": "vllm:kv_cache_usage_perc", "kind": "gauge", "value": 0.5})
    specs = {sp["y_title"]: {se["name"] for se in sp["series"]} for sp in target_specs(pd.DataFrame(rows))}
    assert specs["requests/s"] == {"vllm:request_success", "vllm:num_preemptions"}
    assert specs["tokens/s"] == {"vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens"}
    assert specs["fraction (0-1)"] == {"vllm:kv_cache_usage_perc"}
    fraction = next(f for title, f in draw(target_specs(pd.DataFrame(rows))) if title.endswith("fraction (0-1)"))
    assert fraction.layout.showlegend is True and fraction.data[0].name == "vllm:kv_cache_usage_perc"


def test_summary_table_is_flat_with_one_number_format():
    from replayer.results.report import _summary_table, summary_rows

    rows = summary_rows(
        {
            "completed": 7072928,
            "x_ms": 4413632.0,
            "p99_ttft_ms": 12.34567,
            "ratio": 0.0123456,
            "p99_itl_ms": None,
            "errors_by_kind": {},
            "speedup_changes": [{"t_s": 1.5, "speedup": 20.0}],
            "target_metrics": {
                "deltas": {"prompt_tokens": 4413632.0},
                "scrapes": 12,
                "series_totals": [["vllm:prompt_tokens_total", {}, 1.0]],
            },
        }
    )
    assert rows == [
        ("completed", "7,072,928"),
        ("x_ms", "4,413,632"),
        ("p99_ttft_ms", "12.346"),
        ("ratio", "0.01235"),
        ("p99_itl_ms", "n/a"),
        ("errors_by_kind", "-"),
        ("speedup_changes", "t_s=1.500 speedup=20"),
        ("target_metrics.deltas.prompt_tokens", "4,413,632"),
        ("target_metrics.scrapes", "12"),
    ]
    assert "{" not in _summary_table({"target_metrics": {"deltas": {"a": 1.0}}})


def _dump_dom(html_path) -> str:
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=10000",
                "--dump-dom",
                f"file://{html_path}",
            ],
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_report_cli_writes_self_contained_html(results, tmp_path, capsys):
    target_run = results
    assert cli_main(["report", str(target_run), "-o", str(tmp_path / "r.html")]) == 0
    text = (tmp_path / "r.html").read_text()
    assert "<script src=" not in text and "cdn." not in text.split("</script>")[0][:200]  # plotly.js inline
    for title in (
        "Arrivals: due vs sent vs completed",
        "Latency over time",
        "Latency CDFs",
        "Token throughput",
        "Dispatch lag",
        "Target server metrics: requests",
    ):
        assert title in text, title
    assert "mean_ttft_ms" in text and "target_metrics.deltas.prompt_tokens" in text  # the summary table
    # the verdict first: before the plots (and kept when a killed run's summary is recomputed)
    assert "SLO attainment (every bound)" in text and text.index("<h2>Verdict</h2>") < text.index('id="fig0"')
    assert "ttft&lt;=60000 e2el&lt;=600000" in text
    from replayer.results.report import render_html

    killed = Path(shutil.copytree(results, tmp_path / "killed"))
    (killed / "summary.json").unlink()
    assert "<h2>Verdict</h2>" in render_html(str(killed))
    plain = Path(shutil.copytree(results, tmp_path / "plain"))
    s = json.loads((plain / "summary.json").read_text())
    (plain / "summary.json").write_text(
        json.dumps({k: v for k, v in s.items() if "slo" not in k and "goodput" not in k})
    )
    assert "<h2>Verdict</h2>" not in render_html(str(plain))  # no bounds: no verdict
    capsys.readouterr()
    assert cli_main(["report", str(tmp_path / "nothing")]) == 2
    assert "no results files (requests*.parquet)" in capsys.readouterr().err
    assert cli_main(["report", str(target_run), "-o", str(tmp_path / "no" / "r.html")]) == 2  # no traceback
    assert "cannot write the report" in capsys.readouterr().err
    # a --workers folder: its results are in worker-i/, rolled or not
    from replayer.results.reportdata import load_results

    w = tmp_path / "w"
    for i, name in enumerate(("requests.parquet", "requests-00000.parquet")):
        (w / f"worker-{i}").mkdir(parents=True)
        shutil.copy(Path(results) / "requests.parquet", w / f"worker-{i}" / name)
    df, _, _ = load_results(str(w))
    assert len(df) == 2 * len(load_results(str(results))[0])
    assert cli_main(["report", str(w), "-o", str(tmp_path / "w.html")]) == 0


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium; .ci/run installs it)")
def test_report_plots_draw_in_headless_chromium(results, tmp_path):
    from replayer.observe import read_samples
    from replayer.results.report import figure_specs, write_report
    from replayer.results.reportdata import axis_origin_wall_s, load_results
    from replayer.results.verdictreport import drift_specs

    path = write_report(str(results), str(tmp_path / "report.html"))
    data, summary, _ = load_results(str(results))
    specs = figure_specs(data, read_samples(str(results)).to_pandas(), axis_origin_wall_s(str(results)))
    specs += drift_specs(summary)  # (issue 45: the drift windows, drawn after the others)
    dom = _dump_dom(path)
    figs = re.findall(r'<div id="fig\d+" class="plotly-graph-div js-plotly-plot"', dom)
    assert len(figs) == len(specs) >= 7, len(figs)  # plotly turned every div into a plot
    assert dom.count('class="main-svg"') >= 2 * len(specs)
    # every trace of every figure drew: lines as paths, scatter points as markers
    assert len(re.findall(r'class="trace scatter', dom)) >= sum(len(sp["series"]) for sp in specs)
    assert dom.count('class="point"') >= 200
    assert dom.count('class="js-line"') >= 10


def test_compare_text_and_json(results, tmp_path, capsys):
    b = tmp_path / "b"
    b.mkdir()
    s = json.loads((results / "summary.json").read_text())
    s2 = dict(s, p99_ttft_ms=(s["p99_ttft_ms"] or 1.0) * 2, failed=s["failed"] + 3, errors_by_kind={"timeout": 3})
    (b / "summary.json").write_text(json.dumps(s2))
    capsys.readouterr()
    assert cli_main(["compare", str(results), str(b)]) == 0
    out = capsys.readouterr()
    line = next(x for x in out.out.splitlines() if x.startswith("TTFT p99"))
    assert "+100.0%" in line and line.rstrip().endswith("A")
    assert "errors: timeout" in out.out and "not the same experiment" not in out.out
    assert cli_main(["compare", str(results), str(b / "summary.json"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["setup_differences"] == []
    rows = {r["key"]: r for r in got["rows"]}
    assert rows["failed"]["diff"] == 3 and rows["failed"]["better"] == "a"
    assert rows["p99_ttft_ms"]["pct"] == pytest.approx(100.0)
    assert rows["errors_by_kind.timeout"]["b"] == 3
    assert rows["slo_attainment"]["a"] == s["slo_attainment"] == 1.0  # the verdict is compared too
    assert rows["request_goodput"]["a"] == s["request_goodput"] > 0
    # another size and speed-up: said before the table, and in the JSON
    (b / "summary.json").write_text(json.dumps(dict(s2, scheduled=s["scheduled"] * 2, speedup=s["speedup"] * 4)))
    assert cli_main(["compare", str(results), str(b)]) == 0
    out = capsys.readouterr().out
    assert "the runs are not the same experiment:" in out.split("metric")[0]
    assert f"requests scheduled: {s['scheduled']} in A, {s['scheduled'] * 2} in B" in out
    assert f"speed-up: {s['speedup']} in A, {s['speedup'] * 4} in B" in out
    assert cli_main(["compare", str(results), str(b), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["setup_differences"]) == 2
    assert cli_main(["compare", str(results), str(tmp_path / "gone")]) == 2  # it printed a raw "[Errno 2] ..."
    assert (
        capsys.readouterr().err
        == f"replayer compare: error: {tmp_path / 'gone'}: no such results folder or summary.json\n"
    )
    killed = tmp_path / "killed"  # a SIGKILLed run leaves results files and no summary.json
    killed.mkdir()
    shutil.copy(results / "requests.parquet", killed / "requests.parquet")
    assert cli_main(["compare", str(results), str(killed), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    rows = {r["key"]: r for r in got["rows"]}
    assert rows["completed"]["a"] == rows["completed"]["b"] == s["completed"]
    # its setup comes from the results file's metadata (same trace, speed-up, ...): only the cut
    assert got["setup_differences"] == [
        "B was cut short (by a kill (no summary.json)): its numbers cover part of its run"
    ]
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
