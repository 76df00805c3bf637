"""The daemon as a process: shutdown accounting, second signal, loops, shards, bad input."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pyarrow.parquet as pq
from conftest import SHORT_OUTPUT, free_port, start_up_lead, wait_http
from prometheus_client.parser import text_string_to_metric_families

import replayer.record.folder as folder


def _run(args, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "replayer", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_sigterm_drains_then_accounts_for_every_row(tmp_path, mooncake_slice, sim_process):
    trace = mooncake_slice(60)
    n = sum(1 for _ in open(trace))
    url, _ = sim_process("--itl-base-ms", "40")  # ~300 tokens x 40 ms: still running at SIGTERM
    port = free_port()
    p = _run(
        [
            str(trace),
            "--target",
            url,
            "--speedup",
            "10",
            "--results",
            str(tmp_path / "r"),
            "--admin-port",
            str(port),
            "--drain-timeout",
            "1",
            "--quiet",
        ]
    )
    wait_http(f"http://127.0.0.1:{port}/readyz", 30)
    time.sleep(2.5)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
        st = json.loads(r.read())
    ts = [json.loads(line)["timestamp"] for line in open(trace)]
    assert st["trace_rows"] == st["scheduled"] == n and st["trace_duration_s"] == (ts[-1] - ts[0]) / 1000
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    lags = next(x.value for x in fams["replayer_dispatch_lag_seconds"].samples if x.name.endswith("_count"))
    done = sum(x.value for x in fams["replayer_requests"].samples if x.name == "replayer_requests_total")
    assert lags > done  # dispatch lag is observed when a request goes out, not when it ends
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err[-2000:]  # stopped, not finished: 143
    rows = pq.read_table(tmp_path / "r" / "requests.parquet").to_pylist()
    outcomes = [r["outcome"] for r in rows]
    assert sorted(r["row"] for r in rows) == list(range(n))  # every row exactly once
    sent = sum(r["sent_ns"] is not None for r in rows)
    assert 0 < sent < n
    assert outcomes.count("cancelled") > 0 and outcomes.count("not_started") == n - sent
    assert outcomes.count("success") + outcomes.count("failed") + outcomes.count("cancelled") == sent
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["sent"] + s["not_started"] == s["scheduled"] == n
    assert s["stopped_early"] is True and s["stop_signal"] == "SIGTERM"
    # --quiet writes only what needs attention: the run still ends with its summary and where its results are
    assert "Stopped early (results partial)" in out and "by SIGTERM" in out
    assert out.splitlines()[-1].startswith(f"results: {tmp_path / 'r'}/ (")

    # resumed (a retried pod): the rows not started go now, and the folder holds each row once;
    # --resume DIR alone: the trace and the settings that must match are the checkpoint's
    # (against a simulator with 1 ms token gaps: the slow one was for the SIGTERM to find streams
    # running; the resume's ~300-token responses need not take 12 s each)
    ckpt = json.loads((tmp_path / "r" / "checkpoint.json").read_text())
    fast, _ = sim_process("--itl-base-ms", "1")
    # (not --quiet: the resume's INFO line is checked)
    p = _run(["--resume", str(tmp_path / "r"), "--target", fast, "--speedup", "10", "--admin-port", "0"])
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    assert (
        f"resuming {tmp_path / 'r'} at loop {ckpt['loop']}, row {ckpt['next_row']} (its checkpoint): "
        f"{sent} rows already recorded are skipped" in err
    )
    from replayer.record import read_results, result_files

    rows = read_results(str(tmp_path / "r")).to_pylist()
    assert sorted(r["row"] for r in rows) == list(range(n))  # no row twice
    assert sum(r["outcome"] == "not_started" for r in rows) == 0
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["scheduled"] == s["sent"] == n and s["not_started"] == 0 and s["stopped_early"] is False
    # each run's times are offsets from its own anchor: the duration adds up the two runs
    spans = []
    for f in result_files(str(tmp_path / "r")):
        t = pq.read_table(f).to_pydict()
        spans.append(max(e for e in t["end_ns"] if e is not None) - min(x for x in t["sent_ns"] if x is not None))
    assert len(spans) == 2 and s["runs"] == 2
    assert abs(s["duration"] - sum(spans) / 1e9) < 1e-6
    assert abs(s["request_throughput"] - s["completed"] / s["duration"]) < 1e-9


def test_second_signal_cancels_at_once(tmp_path, mooncake_slice, sim_process):
    trace = mooncake_slice(30)
    url, _ = sim_process("--itl-base-ms", "50")
    port = free_port()
    p = _run(
        [
            str(trace),
            "--target",
            url,
            "--speedup",
            "5",
            "--results",
            str(tmp_path / "r"),
            "--admin-port",
            str(port),
            "--drain-timeout",
            "120",
            "--quiet",
        ]
    )
    wait_http(f"http://127.0.0.1:{port}/readyz", 30)
    time.sleep(2.0)
    p.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    t = time.monotonic()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert time.monotonic() - t < 15  # did not wait out the 120 s drain
    rows = pq.read_table(tmp_path / "r" / "requests.parquet").to_pylist()
    assert any(r["outcome"] == "cancelled" for r in rows)


def test_loops_and_shards_cover_the_trace(tmp_path, mooncake_slice, sim_process):
    trace = mooncake_slice(20, max_output=SHORT_OUTPUT)
    n = sum(1 for _ in open(trace))
    url, received = sim_process()
    got = []
    for k in range(2):
        res = tmp_path / f"s{k}"
        p = _run(
            [
                str(trace),
                "--target",
                url,
                "--speedup",
                "40",
                "--results",
                str(res),
                "--admin-port",
                "0",
                "--loop",
                "2",
                "--shard",
                f"{k}/2",
                "--quiet",
                "--start-delay",
                "0.3",
            ]
        )
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        got += [(r["loop"], r["row"], r["outcome"]) for r in pq.read_table(res / "requests.parquet").to_pylist()]
    assert sorted((lp, r) for lp, r, _ in got) == sorted((lp, r) for lp in (0, 1) for r in range(n))
    assert all(o == "success" for _, _, o in got)


def test_bad_trace_refused_before_sending(tmp_path, sim_process):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"timestamp": 0, "input_length": 20, "output_length": 8, "hash_ids": [1, 2]}\n'
        '{"timestamp": 5, "input_length": -3, "output_length": 8, "hash_ids": [3]}\n'
    )
    url, received = sim_process()
    p = _run([str(bad), "--target", url, "--results", str(tmp_path / "r"), "--admin-port", "0"])
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2
    assert "row 1" in err and "hash_ids" in err and "row 2" in err and "input_length" in err
    assert not received.exists() or received.read_text() == ""


def test_bad_flags_listed_at_once(tmp_path):
    p = _run([str(tmp_path / "missing.parquet"), "--speedup", "-2", "--shard", "3/2"])
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2
    assert "trace" in err and "speedup" in err and "shard" in err


def test_target_down_fails_clearly(tmp_path, mooncake_slice):
    trace = mooncake_slice(5)
    p = _run(
        [
            str(trace),
            "--target",
            f"http://127.0.0.1:{free_port()}",
            "--ready-timeout",
            "2.5",
            "--results",
            str(tmp_path / "r"),
            "--admin-port",
            "0",
        ]
    )
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "not ready after 2 s (cannot connect: ConnectionRefusedError" in err
    assert "waiting for the target: GET http://127.0.0.1" in err  # said while it waited
    assert "ssl:default" not in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()  # nothing was sent: the folder it made is gone again
    p = _run(
        [
            str(trace),
            "--target",
            f"http://127.0.0.1:{free_port()}",
            "--ready-timeout",
            "0.5",
            "--admin-port",
            "0",
            "--quiet",
        ],
        cwd=tmp_path,
    )  # the default folder: ./results stays clean
    assert p.communicate(timeout=60) and p.returncode == 2 and not (tmp_path / "results").exists()


def test_start_up_problems_are_errors_not_tracebacks(tmp_path, mooncake_slice, sim_process):
    trace = mooncake_slice(5)
    url, _ = sim_process()
    with socket.create_server(("127.0.0.1", 0)) as taken:  # another replayer on the admin port
        p = _run(
            [str(trace), "--target", url, "--results", str(tmp_path / "r"), "--admin-port", str(taken.getsockname()[1])]
        )
        out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "--admin-port" in err and "Traceback" not in err, err[-2000:]
    assert not (tmp_path / "r").exists()
    # a URL with an API path the server does not have: the 404 says what --target should be
    p = _run(
        [str(trace), "--target", url + "/api", "--ready-timeout", "1", "--admin-port", "0", "--quiet"], cwd=tmp_path
    )
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "(HTTP 404 (no /v1/models there: --target is the server's base URL" in err, err
    (tmp_path / "afile").write_text("x")
    p = _run([str(trace), "--target", url, "--results", str(tmp_path / "afile"), "--admin-port", "0"])
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "not a folder" in err and "Traceback" not in err, err[-2000:]


def test_sigkill_then_resume_records_every_row_once(tmp_path, mooncake_slice, sim_process):
    trace = mooncake_slice(60, max_output=100)  # (~0.5 s each: requests in flight at the kill)
    n = sum(1 for _ in open(trace))
    url, _ = sim_process("--itl-base-ms", "5")
    res = tmp_path / "r"
    common = [
        "--target",
        url,
        "--speedup",
        "10",
        "--admin-port",
        "0",
        "--quiet",
        "--flush-interval",
        "0.3",
        "--scrape-interval",
        "0.1",
    ]  # target-metric samples: a part every 12 scrapes (1.2 s)
    p = _run([str(trace), "--results", str(res), *common])

    def prompt_tokens_checkpointed() -> float:  # the target's prompt tokens in the last checkpoint
        try:
            totals = json.loads((res / "checkpoint.json").read_text())["target_metrics"]["series_totals"]
        except (OSError, ValueError, KeyError):
            return 0
        return sum(v for name, _, v in totals if name == "vllm:prompt_tokens_total")

    # killed once parts are on disk and a checkpoint carries some of the target's counts (waiting
    # on these, not on a time: start-up alone took tens of seconds beside CPU hogs)
    deadline = time.monotonic() + 120
    while (
        not (
            list(res.glob("parts/part-*.parquet"))
            and list(res.glob("parts/target_metrics-*.parquet"))
            and prompt_tokens_checkpointed() > 0
        )
        and time.monotonic() < deadline
        and p.poll() is None
    ):
        time.sleep(0.05)
    assert p.poll() is None, "the run ended before any part reached the disk"
    time.sleep(0.5)
    p.kill()
    p.communicate(timeout=30)
    from replayer.observe import read_samples
    from replayer.record import read_results

    before = read_results(str(res)).to_pylist()
    assert 0 < len(before) < n  # parts already on disk survived the SIGKILL
    samples_before = read_samples(str(res)).to_pylist()  # and so did the target's metric samples
    assert samples_before and not (res / "target_metrics.parquet").exists()
    killed = json.loads((res / "checkpoint.json").read_text())["target_metrics"]
    # the checkpoint carries the totals of the scrapes made so far (how many depends on the
    # machine's speed: at least the ones whose samples reached the part files)
    assert killed["scrapes"] >= 1 and killed["series_totals"]
    p = _run(["--resume", str(res), str(trace), *common])
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    rows = [r for r in read_results(str(res)).to_pylist() if r["outcome"] != "not_started"]
    assert sorted(r["row"] for r in rows) == list(range(n))
    assert all(r["outcome"] == "success" for r in rows)
    # one samples file: the killed run's parts first, then the resumed run's; its totals carried on
    samples = pq.read_table(res / "target_metrics.parquet").to_pylist()
    assert samples[: len(samples_before)] == samples_before and len(samples) > len(samples_before)
    assert not list(res.glob("parts/target_metrics-*.parquet"))
    tm = json.loads((res / "summary.json").read_text())["target_metrics"]
    assert tm["scrapes"] > killed["scrapes"]
    killed_prompt = sum(v for name, _, v in killed["series_totals"] if name == "vllm:prompt_tokens_total")
    assert 0 < killed_prompt < tm["deltas"]["prompt_tokens"]


def test_ctrl_c_drains_against_the_embedded_simulator_and_a_kill_leaves_no_server(tmp_path, mooncake_slice):
    # Ctrl-C in a terminal sends SIGINT to the whole foreground process group: the embedded
    # simulator (its own session) keeps serving while the replayer drains, so no request in
    # flight fails as a disconnect. A SIGKILLed replayer's simulator exits by itself. (Responses
    # of at most 100 tokens, ~1 s each: dozens are in flight at the Ctrl-C, and the drain does
    # not wait ~9 s for the slice's longest.)
    trace = mooncake_slice(400, max_output=100)
    res = tmp_path / "r"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace),
            "--speedup",
            "20",
            "--results",
            str(res),
            "--admin-port",
            "0",
            "--drain-timeout",
            "30",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not list(res.glob("parts/part-*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-2000:]
    rows = pq.read_table(res / "requests.parquet").to_pylist()
    assert rows and not [r for r in rows if r["error_kind"] == "disconnect"]
    assert sum(r["outcome"] == "success" for r in rows) > 0

    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace),
            "--speedup",
            "20",
            "--results",
            str(tmp_path / "k"),
            "--admin-port",
            "0",
            "--log-level",
            "info",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = None
    for line in p.stderr:
        if "starting the embedded simulator at" in line:
            url = line.rsplit(" at ", 1)[1].strip()
            break
    assert url, "no simulator URL in the log"
    wait_http(url + "/health", 30)
    p.kill()
    p.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
        except OSError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the simulator outlived its SIGKILLed parent")


def test_self_watch_reports_each_loop_stall_once_and_apart_from_lateness(caplog):
    import asyncio
    import logging

    from prometheus_client import CollectorRegistry

    from replayer.observe import ReplayerMetrics
    from replayer.run.live import RunState, watch_self as _watch_self

    async def main():
        state, metrics = RunState(), ReplayerMetrics(CollectorRegistry())
        task = asyncio.ensure_future(_watch_self(state, metrics, every_s=0.05))
        metrics.on_event_loop_lag(0.080)  # one 80 ms stall; the sends stayed on time
        await asyncio.sleep(0.22)  # four intervals
        state.watch_max_lag_ms = 120.0  # then requests went out late
        await asyncio.sleep(0.05)
        task.cancel()

    with caplog.at_level(logging.INFO, logger="replayer.run.daemon"):
        asyncio.run(main())
    stalls = [r for r in caplog.records if "event loop stalled for up to 80 ms" in r.getMessage()]
    behind = [r for r in caplog.records if "behind schedule: max dispatch lag 120 ms" in r.getMessage()]
    assert len(stalls) == 1 and len(behind) == 1
    assert "behind schedule" not in stalls[0].getMessage()


def test_resume_refuses_settings_that_change_the_prompts(tmp_path, mooncake_slice, sim_process):
    trace = mooncake_slice(10, max_output=SHORT_OUTPUT)
    url, _ = sim_process()
    res = tmp_path / "r"
    common = ["--target", url, "--admin-port", "0", "--quiet"]
    p = _run([str(trace), "--results", str(res), "--speedup", "50", *common])
    assert p.communicate(timeout=120) and p.returncode == 0
    before = (res / "requests.parquet").read_bytes()
    p = _run(
        ["--resume", str(res), str(trace), "--speedup", "50", "--seed", "7", "--vocab-range", "2000:40000", *common]
    )
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2, err[-2000:]
    assert "--seed 0 there, 7 now" in err and "--vocab-range" in err and "2000:40000" in err
    assert (res / "requests.parquet").read_bytes() == before  # nothing sent, nothing rewritten
    p = _run(["--resume", str(res), str(trace), "--speedup", "80", *common])  # another speed-up is fine
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    # a new run into the used folder is refused (it would be summarized with the earlier runs)
    files = sorted(x.name for x in res.iterdir())
    for args in (["--results", str(res), str(trace)], ["--results", str(res), "--workers", "2", str(trace)]):
        p = _run([*args, *common])
        out, err = p.communicate(timeout=120)
        assert p.returncode == 2 and f"--resume {res} continues that run" in err and "Traceback" not in err, err
        assert sorted(x.name for x in res.iterdir()) == files


def test_runs_started_in_the_same_second_get_their_own_results_folders(tmp_path, monkeypatch):

    monkeypatch.setattr(folder.time, "strftime", lambda fmt: "20261201-120000")
    made = [folder.new_results_dir(str(tmp_path / "results")) for _ in range(3)]
    assert [os.path.basename(m) for m in made] == ["20261201-120000", "20261201-120000-2", "20261201-120000-3"]
    assert all(os.path.isdir(m) and not os.listdir(m) for m in made)


def test_a_resumed_folder_has_the_target_metrics_of_every_run(tmp_path, mooncake_slice, sim_process):
    trace = mooncake_slice(40, max_output=SHORT_OUTPUT)
    url, _ = sim_process()
    res = tmp_path / "r"
    common = [
        str(trace),
        "--target",
        url,
        "--speedup",
        "10",
        "--admin-port",
        "0",
        "--quiet",
        "--scrape-interval",
        "0.5",
    ]
    p = _run([*common, "--results", str(res), "--duration", "1.5"])
    assert p.communicate(timeout=120) and p.returncode == 0
    first = json.loads((res / "summary.json").read_text())["target_metrics"]
    first_samples = pq.read_table(res / "target_metrics.parquet").to_pylist()
    p = _run(["--resume", str(res), *common])
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    whole = json.loads((res / "summary.json").read_text())
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:  # the server's own count, both runs
        served = {s.name: s.value for f in text_string_to_metric_families(r.read().decode()) for s in f.samples}
    tm = whole["target_metrics"]
    assert 0 < first["deltas"]["prompt_tokens"] < tm["deltas"]["prompt_tokens"]
    assert tm["deltas"]["prompt_tokens"] == served["vllm:prompt_tokens_total"]
    assert tm["scrapes"] > first["scrapes"]
    samples = pq.read_table(res / "target_metrics.parquet").to_pylist()
    assert samples[: len(first_samples)] == first_samples and len(samples) > len(first_samples)  # appended


def test_a_start_time_long_past_starts_now_instead_of_a_burst(tmp_path, mooncake_slice, sim_process):
    """A shard pod scheduled late, or retried (--resume with the Job's --start-at): the run
    replays from its own start, on time, instead of sending every overdue request at once."""
    trace = mooncake_slice(30)
    url, _ = sim_process("--itl-base-ms", "2")
    res = tmp_path / "r"
    started = time.time()
    past = repr(started - 30)
    common = [str(trace), "--target", url, "--speedup", "10", "--admin-port", "0", "--start-at", past]
    p = _run([*common, "--quiet", "--results", str(res), "--duration", "1.5"])  # (its line is a warning)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    # missed by 30 s plus however long the start-up took (seconds on a busy machine)
    missed = re.search(r"passed ([0-9.]+) s ago: starting now, ([0-9.]+) s out of step", err)
    assert missed and 30 <= float(missed[1]) == float(missed[2]) <= time.time() - started + 30.1, err[-2000:]
    s = json.loads((res / "summary.json").read_text())
    n = sum(1 for _ in open(trace))
    # a burst would be as late as the start was missed (~30,000 ms); half that is far more than a
    # busy machine delays a send
    burst_ms = float(missed[1]) * 1e3
    assert 0 < s["sent"] < n and s["dispatch_lag_max_ms"] < burst_ms / 2, (s["dispatch_lag_max_ms"], burst_ms)
    p = _run([*common, "--resume", str(res)])  # (not --quiet: its "resuming now" line is INFO)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    assert "resuming now: the run's --start-at" in err and "out of step" not in err
    s = json.loads((res / "summary.json").read_text())
    assert s["sent"] == s["completed"] == n and s["dispatch_lag_max_ms"] < burst_ms / 2


def test_status_says_waiting_until_the_start_time(tmp_path, mooncake_slice, sim_process):
    trace = mooncake_slice(30)
    url, _ = sim_process("--itl-base-ms", "2")
    port = free_port()
    # (start-up alone took over 4 s on a 2-core machine at load average 10: the lead is measured)
    start = time.time() + start_up_lead(trace, 1)
    p = _run(
        [
            str(trace),
            "--target",
            url,
            "--speedup",
            "10",
            "--results",
            str(tmp_path / "r"),
            "--admin-port",
            str(port),
            "--start-at",
            repr(start),
            "--drain-timeout",
            "1",
        ]
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", 30)
        states = []
        while time.time() < start + 3:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as r:
                states.append((time.time() < start - 0.05, json.loads(r.read())["state"]))
            time.sleep(0.1)
        assert {s for before, s in states if before} == {"waiting"}
        assert states[-1][1] == "running"
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    assert "waiting to start:" in err  # the progress line before the start


def test_max_error_ratio_fails_a_run_whose_requests_failed(tmp_path, mooncake_slice, sim_process):
    """Every request answered 404 (a wrong --endpoint): exit 3 with --max-error-ratio, saying why;
    and by default too (issue 47: the run measured nothing); --max-error-ratio 1 lets it pass."""
    trace = mooncake_slice(20)
    url, _ = sim_process()
    base = [
        str(trace),
        "--target",
        url,
        "--endpoint",
        "/v1/nope",
        "--max-requests",
        "4",
        "--speedup",
        "50",
        "--admin-port",
        "0",
        "--quiet",
    ]
    p = _run([*base, "--results", str(tmp_path / "a")])
    out, err = p.communicate(timeout=120)
    assert p.returncode == 3 and "all 4 requests that ended failed (http_status 4)" in err, err[-2000:]
    p = _run([*base, "--results", str(tmp_path / "c"), "--max-error-ratio", "1"])
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    p = _run([*base, "--results", str(tmp_path / "b"), "--max-error-ratio", "0.5"])
    out, err = p.communicate(timeout=120)
    assert p.returncode == 3, err[-2000:]
    assert "4 of 4 requests failed (100.0%; http_status 4), more than --max-error-ratio 0.5: exit 3" in err
    s = json.loads((tmp_path / "b" / "summary.json").read_text())  # the results are there all the same
    assert s["failed"] == 4


def test_error_ratio_problem():
    from replayer.run.daemon import error_ratio_problem

    s = {"completed": 99, "failed": 1}
    assert error_ratio_problem(s, None) is None and error_ratio_problem(s, 0.01) is None
    assert error_ratio_problem(s, 0.0).startswith("1 of 100 requests failed (1.0%)")
    assert error_ratio_problem({"completed": 0, "failed": 0}, 0.0) is None  # nothing ended: no ratio


def test_count_scheduled_counts_what_will_be_sent(mooncake_slice):
    """Pure: the count behind /status ``scheduled`` and the progress line's ``sent N/M``."""
    from replayer.plan import iter_schedule
    from replayer.run.inputs import count_scheduled
    from replayer.trace import open_trace

    trace = mooncake_slice(60)
    offsets_ms = [json.loads(line)["timestamp"] for line in open(trace)]
    offsets_ms = [t - min(offsets_ms) for t in offsets_ms]
    n = len(offsets_ms)
    src = open_trace(str(trace))
    batches = lambda: src.batches(50)  # noqa: E731 - several batches
    assert count_scheduled(iter_schedule(batches), speedup=10) == n
    # --duration 2 at speed-up 10: the rows of the first 20 trace seconds
    assert (
        count_scheduled(iter_schedule(batches), speedup=10, duration_ns=2_000_000_000)
        == sum(t < 20_000 for t in offsets_ms)
        < n
    )
    assert sum(count_scheduled(iter_schedule(batches, shard=i, shards=3), speedup=1) for i in range(3)) == n
    assert count_scheduled(iter_schedule(batches, loops=2, max_requests=n + 5), speedup=1) == n + 5
    assert count_scheduled(iter_schedule(batches, loops=None), speedup=10, duration_ns=10**10) > n  # ends
    assert count_scheduled(iter_schedule(batches, loops=None), speedup=10, limit=3 * n) is None


def test_status_counts_the_requests_a_duration_will_send(tmp_path, mooncake_slice, sim_process):
    """``--duration`` sends fewer rows than the trace has: /status and the progress line count
    those (it said ``sent 40/19366`` with 371 scheduled)."""
    trace = mooncake_slice(60)
    url, _ = sim_process()
    port = free_port()
    p = _run(
        [
            str(trace),
            "--target",
            url,
            "--speedup",
            "10",
            "--duration",
            "2",
            "--results",
            str(tmp_path / "r"),
            "--admin-port",
            str(port),
            "--quiet",
        ]
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", 60)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
            scheduled = json.loads(r.read())["scheduled"]
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-2000:]
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert 0 < scheduled == s["scheduled"] == s["sent"] < sum(1 for _ in open(trace))


def test_a_trace_with_no_schedulable_row_exits_2_with_its_results(tmp_path, sim_process):
    """A capture whose rows all failed (nothing to hash): the run said "no row of the trace was
    scheduled" and exited 0, which a CI job reads as a replay that held."""
    from replayer.capture.fromlog import write_rows

    row = dict.fromkeys(("input_length", "output_length", "hash_ids", "request_id", "session_id", "model"))
    rows = [{**row, "timestamp": i, "endpoint": "/v1/completions", "status": 200, "outcome": "ok"} for i in range(3)]
    trace = tmp_path / "failed.parquet"
    write_rows(rows, str(trace), block_size=16, source="test")
    url, _ = sim_process()
    p = _run([str(trace), "--target", url, "--results", str(tmp_path / "r"), "--admin-port", "0", "--quiet"])
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2, err
    assert "failed.parquet could be scheduled" in err and "Traceback" not in err
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["scheduled"] == 0  # results on disk
