"""`replayer sweep` (replayer/run/sweep.py): a loop of real runs against the simulator on 127.0.0.1.

The knee test gives the simulator a small capacity (2 sequences at a time, 20 ms per token, 14
tokens per request: ~0.3 s each, so ~6.7 requests/s) and a trace of requests evenly spaced
(2.5 requests/s at 1x). With even arrivals and a fixed service time a server below capacity
never queues, and above it the queue grows by the same step per request: at 2x (5 requests/s,
70% of capacity) no request waits, at 4x (10 requests/s, 150%) request i waits ~45 ms * i, so
about half of 24 miss a 500 ms TTFT bound. Both sides are far from the 90% rule, and nothing is
near what the client's CPU limits (at most 10 requests/s)."""

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_report import CHROMIUM, _dump_dom

from replayer.cli import main as cli_main
from replayer.run.sweep import SweepError, parse_speedups


def write_trace(path, n: int, gap_ms: int, output_length: int, hash_ids, start_ms: int = 0) -> str:
    """``n`` requests ``gap_ms`` apart from ``start_ms``, 16-token blocks; ``hash_ids(i)`` gives
    row i's ids."""
    ids = [hash_ids(i) for i in range(n)]
    t = pa.table(
        {
            "timestamp": [start_ms + i * gap_ms for i in range(n)],
            "input_length": [16 * len(h) for h in ids],
            "output_length": [output_length] * n,
            "hash_ids": ids,
        }
    )
    pq.write_table(t.replace_schema_metadata({"replayer.block_size": "16", "replayer.time_unit": "ms"}), path)
    return str(path)


def sweep(capsys, trace: str, url: str | None, results, *flags: str) -> tuple[int, dict, list[str]]:
    """Run ``replayer sweep`` in-process (``url`` None: on the embedded simulator): (exit code,
    sweep.json, progress lines)."""
    capsys.readouterr()
    code = cli_main(
        [
            "sweep",
            trace,
            *(["--target", url] if url else []),
            "--results",
            str(results),
            "--admin-port",
            "0",
            "--max-dispatch-lag",
            "2000",
            *flags,
        ]
    )
    out = capsys.readouterr().out.splitlines()
    return code, json.loads((results / "sweep.json").read_text()), out


def test_sweep_finds_the_knee_of_the_simulators_capacity(sim_process, tmp_path, capsys):
    url, _ = sim_process(
        "--max-num-seqs", "2", "--itl-base-ms", "20", "--ttft-base-ms", "20", "--prefill-us-per-token", "0"
    )
    trace = write_trace(tmp_path / "t.parquet", 24, 400, 14, lambda i: [2 * i, 2 * i + 1])
    res = tmp_path / "sweep"
    code, s, out = sweep(
        capsys,
        trace,
        url,
        res,
        "--speedups",
        "1,2,4,8,16",
        "--goodput",
        "ttft:500",
        "e2el:5000",
        "--scrape-interval",
        "1",
    )
    assert code == 0
    # the stop rule: the first point below 90% ends the sweep (8x and 16x never ran)
    assert [p["speedup"] for p in s["points"]] == [1.0, 2.0, 4.0]
    assert [p["status"] for p in s["points"]] == ["held", "held", "missed"], [p["why"] for p in s["points"]]
    assert s["highest_held_speedup"] == 2.0
    assert s["stop_reason"].startswith("attainment ") and s["stop_reason"].endswith("< 90% at speed-up 4x")
    held, missed = s["points"][1], s["points"][2]
    assert held["slo_attainment"] == 1.0 and held["slo_met"] == 24
    assert missed["slo_attainment"] < 0.8 and missed["p99_ttft_ms"] > 500
    # offered load from the due times: 2.5 requests/s at 1x, times the speed-up
    for p in s["points"]:
        assert p["offered_rps"] == pytest.approx(2.5 * p["speedup"], rel=1e-3)
        assert p["replayer_behind"] is False and p["exit_code"] == 0
    assert s["highest_held_offered_rps"] == pytest.approx(5.0, rel=1e-3)
    assert s["highest_held_request_goodput"] == held["request_goodput"] > 0
    # sweep.json: the settings, and per point its folder (a whole run's) and the summary's numbers
    assert s["speedups"] == [1.0, 2.0, 4.0, 8.0, 16.0] and s["min_attainment"] == 0.9
    assert s["goodput_slos_ms"] == {"ttft": 500.0, "e2el": 5000.0} and s["prefix_cache"] == "salt"
    assert s["target"] == url and s["target_embedded"] is False
    for p in s["points"]:
        point_summary = json.loads((res / p["results"] / "summary.json").read_text())
        assert point_summary["speedup"] == p["speedup"] and point_summary["completed"] == 24
        for key in (
            "request_goodput",
            "slo_attainment",
            "slo_attainment_ttft",
            "median_ttft_ms",
            "p99_ttft_ms",
            "median_tpot_ms",
            "p99_tpot_ms",
            "median_e2el_ms",
            "p99_e2el_ms",
            "dispatch_lag_p99_ms",
            "max_concurrent_requests",
        ):
            assert p[key] == point_summary[key], key
        assert p["max_concurrent_requests"] >= 1  # (each point's peak in flight, exact)
    assert sorted(x.name for x in res.iterdir()) == [
        "01-speedup-1",
        "02-speedup-2",
        "03-speedup-4",
        "plotly.min.js",  # (issue 47: the page loads the library from beside it)
        "sweep.html",
        "sweep.json",
    ]
    # progress: one line per point, then the outcome
    lines = [line for line in out if line.startswith("sweep point ")]
    assert len(lines) == 3 and lines[2].startswith("sweep point 3/5: speed-up 4x, offered 10.00 req/s; steady window")
    assert lines[0].endswith(": held") and ": missed (attainment " in lines[2]
    assert "the highest speed-up that held: 2x (5.00 req/s offered, " in out[-2]
    # achieved vs offered over each held point's steady window (the first and last tenth left out,
    # or a median E2E if longer: the requests take ~0.3 s, less than a tenth of the 4.6 s span at
    # 2x on an idle machine); below capacity, the server completes what it is offered
    for p in s["points"][:2]:
        w = p["steady_window"]
        transient = max(0.1 * w["span_s"], w["median_e2el_ms"] / 1e3)
        assert w["start_s"] == pytest.approx(transient) and w["end_s"] == pytest.approx(w["span_s"] - transient)
        assert w["sustained"] and w["slo_attainment"] == 1.0 and w["judged"] == w["due"] >= 12
        assert abs(w["completed"] - w["due"]) <= 2 and p["achieved_rps"] == w["achieved_rps"]
        assert f"achieved {w['achieved_rps']:.2f} req/s" in lines[p["index"] - 1]
    assert s["highest_held_achieved_rps"] == held["achieved_rps"]
    assert s["steady_rule"] == {
        "transient_fraction": 0.1,
        "transient_at_least": "median_e2el",
        "min_achieved_fraction": 0.9,
    }
    # the page: every figure drew in headless Chromium, against the offered load
    from replayer.results.sweepreport import sweep_figure_specs

    specs = sweep_figure_specs(s)
    assert [sp["title"] for sp in specs] == [
        "Goodput and throughput vs offered load",
        "SLO attainment vs offered load",
        "TTFT vs offered load",
        "TPOT vs offered load",
        "E2E vs offered load",
        "Dispatch lag vs offered load (the replayer's own delay)",
    ]
    att = specs[1]["series"]
    assert [se["name"] for se in att] == [
        "every bound, steady window (judged)",
        "every bound, whole run",
        "ttft <= 500 ms, whole run",
        "e2el <= 5000 ms, whole run",
        "--min-attainment 0.9",
    ]
    assert list(att[0]["x"]) == [p["offered_rps"] for p in s["points"]]
    # the window's attainment is plotted, as the status is judged on it
    assert list(att[0]["y"]) == [p["steady_window"]["slo_attainment"] for p in s["points"]]
    assert list(att[1]["y"]) == [p["slo_attainment"] for p in s["points"]]
    text = (res / "sweep.html").read_text()
    assert "the highest speed-up that held: <b>2x</b>" in text and "<script src=" not in text
    if CHROMIUM is None:
        pytest.skip("needs chromium for the page's drawing")
    dom = _dump_dom(res / "sweep.html")
    figs = re.findall(r'<div id="fig\d+" class="plotly-graph-div js-plotly-plot"', dom)
    assert len(figs) == len(specs)  # plotly turned every div into a plot
    assert dom.count('class="main-svg"') >= 2 * len(specs)
    assert len(re.findall(r'class="trace scatter', dom)) >= sum(len(sp["series"]) for sp in specs)
    assert dom.count('class="point"') >= 3 * 9  # the markers: 3 points on 10 lines+markers series


@pytest.mark.parametrize("mode", ["salt", "reset", "warm"])
def test_points_do_not_share_the_prefix_cache(sim_process, tmp_path, capsys, mode):
    """Rows 2i and 2i+1 share their first two blocks, so within one point the second hits 32
    tokens, as the replayer expects. With fresh prefixes (salt) or the server's cache reset
    before each point, point 2 hits exactly what point 1 did; warm (neither), point 2 also hits
    point 1's prompts. ``reset`` runs on the embedded simulator (one for every point). The
    requests are far enough apart (200 ms at 1x) to reach the server in order, and the first
    comes after the run's first scrape of the server's counters (2 s into the trace)."""
    url = None if mode == "reset" else sim_process("--ttft-base-ms", "1", "--itl-base-ms", "1")[0]
    trace = write_trace(
        tmp_path / "t.parquet",
        12,
        200,
        2,
        lambda i: [i // 2 * 10, i // 2 * 10 + 1, *([1000 + i] * (i % 2))],
        start_ms=2000,
    )
    code, s, _ = sweep(
        capsys,
        trace,
        url,
        tmp_path / "sweep",
        "--speedups",
        "1,2",
        "--goodput",
        "e2el:10000",
        "--prefix-cache",
        mode,
        "--scrape-interval",
        "1",
        *(["--run-id", "sw"] if mode == "salt" else []),
    )
    assert code == 0 and [p["status"] for p in s["points"]] == ["held", "held"]
    one, two = s["points"]
    assert one["expected_prefix_hit_tokens"] == two["expected_prefix_hit_tokens"] == 6 * 32
    assert one["server_prefix_cache_hit_tokens"] == 6 * 32
    if mode == "warm":  # every prompt was cached by point 1: 1 block of the 32-token rows, 2 of the 48-token rows
        assert two["server_prefix_cache_hit_tokens"] == 6 * 16 + 6 * 32
    else:
        assert two["server_prefix_cache_hit_tokens"] == one["server_prefix_cache_hit_tokens"]
    assert (one["seed"] != two["seed"]) is (mode == "salt")
    assert one["run_id"] != two["run_id"]  # a run of its own each: request ids never repeat across points
    if mode == "salt":
        assert [one["run_id"], two["run_id"]] == ["sw-01", "sw-02"]
    assert s["target_embedded"] is (url is None)
    if url is None:  # the points' summaries say so too (the sweep named its simulator to them)
        assert json.loads((tmp_path / "sweep" / one["results"] / "summary.json").read_text())["target_embedded"]


def test_sweep_refuses_bad_settings(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.parquet", 2, 100, 2, lambda i: [i])
    for flags, why in (
        (["--speedups", "1,2"], "--goodput is needed"),
        (["--speedups", "1,2", "--goodput", "ttft:1", "--speedup", "3"], "--speedup: not for a sweep"),
        (["--speedups", "2,1", "--goodput", "ttft:1"], "larger than the one before"),
        (["--speedups", "1,x", "--goodput", "ttft:1"], "must be numbers"),
        (["--speedups", "1", "--goodput", "ttft:1", "--min-attainment", "2"], "between 0 and 1"),
        (["--goodput", "ttft:1"], "--speedups is needed (or speedups: in the --config file)"),
    ):
        capsys.readouterr()
        assert cli_main(["sweep", trace, "--results", str(tmp_path / "r"), *flags]) == 2, flags
        assert why in capsys.readouterr().err, flags
    assert not (tmp_path / "r").exists()  # refused before anything ran
    assert parse_speedups("1, 2,4.5") == [1.0, 2.0, 4.5]
    with pytest.raises(SweepError):
        parse_speedups(",".join(str(i) for i in range(1, 34)))  # more points than a sweep runs


def test_a_burst_shorter_than_its_latencies_does_not_hold(tmp_path, capsys):
    """24 requests 400 ms apart at 2x: 4.6 s of steady load, each request ~0.2 s on the embedded
    simulator: held. At 64x the same 24 requests are a 0.14 s burst, over before the first of
    them ends: every request meets the generous SLO (attainment 100%), but the load was never
    steady, so the point does not hold and the sweep stops there."""
    trace = write_trace(tmp_path / "t.parquet", 24, 400, 14, lambda i: [i])
    code, s, out = sweep(capsys, trace, None, tmp_path / "sweep", "--speedups", "2,64,128", "--goodput", "e2el:20000")
    assert code == 0
    assert [p["status"] for p in s["points"]] == ["held", "window_too_short"], [p["why"] for p in s["points"]]
    steady, burst = s["points"]
    assert burst["slo_attainment"] == 1.0 and burst["completed"] == 24  # what the old rule called held
    assert burst["offered_rps"] == pytest.approx(2.5 * 64, rel=1e-3)
    w = burst["steady_window"]
    assert w["too_short"] and w["span_s"] == pytest.approx(23 * 0.4 / 64, rel=1e-3)
    assert w["warmup_s"] == pytest.approx(w["median_e2el_ms"] / 1e3) and w["warmup_s"] > 0.1 * w["span_s"]
    assert s["highest_held_speedup"] == 2.0 and s["highest_held_achieved_rps"] == steady["achieved_rps"] > 0
    assert s["stop_reason"].endswith("at speed-up 64x") and "--max-requests" in s["stop_reason"]
    lines = [line for line in out if line.startswith("sweep point ")]
    assert "steady window: too short (" in lines[1] and lines[1].endswith(")") and ": window_too_short (" in lines[1]
    page = (tmp_path / "sweep" / "sweep.html").read_text()
    assert "achieved req/s" in page and "window_too_short" in page


def test_sweep_settings_from_the_config_file(tmp_path, capsys):
    """``speedups:`` (a list or a string) and the sweep's other settings come from --config;
    flags override them; an unknown key is still refused with a hint."""
    trace = write_trace(tmp_path / "t.parquet", 6, 100, 2, lambda i: [i])
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(
        "speedups: [1, 2]\ngoodput: [e2el:10000]\nmin_attainment: 0.5\nprefix_cache: warm\nmax_dispatch_lag: 2000\n"
    )
    capsys.readouterr()
    code = cli_main(["sweep", trace, "--config", str(cfg), "--results", str(tmp_path / "a"), "--admin-port", "0"])
    s = json.loads((tmp_path / "a" / "sweep.json").read_text())
    assert code == 0 and s["speedups"] == [1.0, 2.0] and [p["speedup"] for p in s["points"]] == [1.0, 2.0]
    assert s["min_attainment"] == 0.5 and s["prefix_cache"] == "warm" and s["max_dispatch_lag_p99_ms"] == 2000
    cfg.write_text('speedups: "1,3"\ngoodput: [e2el:10000]\nmin_attainment: 0.5\n')
    code = cli_main(
        ["sweep", trace, "--config", str(cfg), "--speedups", "4", "--results", str(tmp_path / "b"), "--admin-port", "0"]
    )
    s = json.loads((tmp_path / "b" / "sweep.json").read_text())
    assert code == 0 and s["speedups"] == [4.0] and s["min_attainment"] == 0.5  # the flag won, the rest kept
    capsys.readouterr()
    cfg.write_text("speed_ups: [1, 2]\ngoodput: [e2el:10000]\n")
    assert cli_main(["sweep", trace, "--config", str(cfg), "--results", str(tmp_path / "c")]) == 2
    assert "unknown setting 'speed_ups' (did you mean 'speedups'?)" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_the_page_shows_each_points_window_and_achieved_vs_offered():
    """The sweep page (pure: from a scripted sweep.json): the rule, and per point its steady
    window, offered and achieved rates, the window's attainment; a too-short window says so."""
    from replayer.results.sweepreport import render_sweep_html, sweep_figure_specs

    window = {
        "span_s": 29.9,
        "start_s": 2.99,
        "end_s": 26.91,
        "window_s": 23.92,
        "warmup_s": 2.99,
        "median_e2el_ms": 300.0,
        "offered_rps": 10.03,
        "achieved_rps": 9.87,
        "slo_attainment": 0.995,
        "request_goodput": 9.9,
        "too_short": False,
    }
    burst = {**window, "span_s": 0.4, "window_s": -24.6, "median_e2el_ms": 12_500.0, "too_short": True}
    burst.update(offered_rps=None, achieved_rps=None, slo_attainment=None, request_goodput=None)  # no window left
    sweep = {
        "goodput_slos_ms": {"e2el": 30000.0},
        "min_attainment": 0.9,
        "steady_rule": {"transient_fraction": 0.1, "min_achieved_fraction": 0.9},
        "highest_held_speedup": 4.0,
        "highest_held_offered_rps": 10.0,
        "highest_held_achieved_rps": 9.87,
        "highest_held_request_goodput": 9.5,
        "points": [
            {"index": 1, "speedup": 4.0, "offered_rps": 10.0, "achieved_rps": 9.87, "steady_window": window},
            {"index": 2, "speedup": 256.0, "offered_rps": 750.0, "achieved_rps": None, "steady_window": burst},
        ],
    }
    page = render_sweep_html(sweep)
    for text in (
        "<th>offered req/s (window)</th><th>achieved req/s (window)</th><th>attainment (window)</th>",
        "<td>2.99-26.91 s of 29.90 s</td><td>10.030</td><td>9.870</td><td>99.5%</td>",
        "<td>too short: 0.00 s of a 0.40 s span, median E2E 12.50 s</td><td>n/a</td><td>n/a</td><td>n/a</td>",
        "9.870 achieved over its steady window",
        "completed at least 90% of the requests offered in it",
    ):
        assert text in page, text
    goodput = sweep_figure_specs(sweep)[0]["series"]
    assert goodput[2]["name"] == "achieved over the steady window"
    assert list(goodput[2]["y"][:1]) == [9.87] and list(goodput[3]["y"]) == [10.0, 750.0]
