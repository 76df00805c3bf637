"""Scale-out: N `replayer run --shard i/N` processes with one `--start-at` against one simulator
add up to a single-process run (rows, send times, prompts, summary); `replayer merge`;
`--workers N` end to end, including a terminal Ctrl-C (one drain, no cancellation)."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import free_port

from replayer.core import RequestResult
from replayer.core.result import to_table
from replayer.record import read_results, result_files
from replayer.results.merge import merge_results
from replayer.run.workers import _exit_code, _progress, _without_flag, progress_line
from replayer.trace import read_trace

SPEEDUP = 20
SHARDS = 3
# shorter decode steps than the default: the slice completes in a few seconds
SIM_ARGS = ("--itl-base-ms", "2", "--itl-per-running-us", "0")
COUNT_FIELDS = (
    "scheduled",
    "sent",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "prompt_token_mismatches",
)


def _run(trace, url, results, *extra):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace),
            "--target",
            url,
            "--speedup",
            str(SPEEDUP),
            "--results",
            str(results),
            "--admin-port",
            "0",
            "--quiet",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _start_up_lead(trace, processes: int) -> float:
    """Seconds to give ``processes`` replays started at once to be ready: four times the time
    one process takes now to import and read ``trace`` (``trace inspect``), times the processes
    sharing each CPU (a replay is two: its launcher's too); at least 5 s."""
    t = time.monotonic()
    subprocess.run([sys.executable, "-m", "replayer", "trace", "inspect", str(trace)], capture_output=True, check=True)
    one_s = time.monotonic() - t
    return max(5.0, 4.0 * one_s * max(1.0, 2 * processes / (os.cpu_count() or 1)))


def _finish(procs, timeout=120):
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-3000:]


def _mono_minus_wall_ns() -> int:
    """perf_counter_ns() - time_ns() (both clocks are system-wide on Linux), best of a few reads."""
    best = None
    for _ in range(50):
        a = time.perf_counter_ns()
        w = time.time_ns()
        b = time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, (a + b) // 2 - w)
    return best[1]


def _received_by_row(path, trace):
    """The sim's recorded requests by trace row: rows are told apart by (input_length,
    output_length), unique in the slice used here."""
    key_row = {(int(trace.input_length[i]), int(trace.output_length[i])): i for i in range(len(trace))}
    assert len(key_row) == len(trace), "slice has rows with equal lengths: pick another slice"
    got = [orjson.loads(line) for line in path.read_text().splitlines()]
    by_row = {}
    for g in got:
        row = key_row[(len(g["prompt"]), g["max_tokens"])]
        assert row not in by_row, f"row {row} received twice"
        by_row[row] = g
    return by_row


def test_shards_on_one_machine_add_up_to_a_single_run(tmp_path, mooncake_slice, sim_process):
    trace_path = mooncake_slice(20)
    trace = read_trace(str(trace_path))
    n = len(trace)
    assert n > 50 and trace.session_id is None  # no sessions: row r belongs to shard r % SHARDS
    url_sharded, rec_sharded = sim_process(*SIM_ARGS)
    url_single, rec_single = sim_process(*SIM_ARGS)
    # every process must have loaded the trace and reached the target before the shared start:
    # four processes starting at once on a busy 2-core machine took up to ~10 s (~30 s at load
    # average 11), so the lead is measured on this machine now, not fixed
    lead = _start_up_lead(trace_path, SHARDS + 1)
    start_at = time.time() + lead
    dirs = [tmp_path / f"shard-{i}" for i in range(SHARDS)]
    procs = [
        _run(trace_path, url_sharded, d, "--shard", f"{i}/{SHARDS}", "--start-at", repr(start_at))
        for i, d in enumerate(dirs)
    ]
    single = tmp_path / "single"
    procs.append(_run(trace_path, url_single, single))
    _finish(procs)

    # every trace row exactly once over the union, each in its own shard
    tables = [read_results(str(d)) for d in dirs]
    rows = np.concatenate([t.column("row").to_numpy() for t in tables])
    assert sorted(rows.tolist()) == list(range(n))
    for i, t in enumerate(tables):
        assert set(t.column("row").to_pylist()) == {r for r in range(n) if r % SHARDS == i}
        assert set(t.column("outcome").to_pylist()) == {"success"}

    # one anchor: every shard anchored at the shared start time
    for d in dirs:
        for f in result_files(str(d)):
            wall = float(pq.read_schema(f).metadata[b"replayer.t0_wall_s"])
            assert abs(wall - start_at) < 1e-3, f"{d} anchored {wall - start_at:.1f} s late: start-up over {lead:.1f} s"

    # sent at its time: due = trace offset / speedup, never early, never grossly late (a shard on
    # another anchor would be seconds off)
    res = pa.concat_tables(tables).to_pylist()
    for r in res:
        expected_due = trace.timestamp_ns[r["row"]] / SPEEDUP
        assert abs(r["due_ns"] - expected_due) <= 1_000_000, r
        assert 0 <= r["sent_ns"] - r["due_ns"] < 1_000_000_000, r
    due_of = {r["row"]: r["due_ns"] for r in res}

    # what the one simulator saw: every row once, never before its due time on the shared anchor
    # (all processes share the machine's monotonic clock), and in due order across the shards.
    # (How late it arrived measures the simulator, which is CPU-bound here, not the senders.)
    received = _received_by_row(rec_sharded, trace)
    assert sorted(received) == list(range(n))
    t0_mono_ns = round(start_at * 1e9) + _mono_minus_wall_ns()
    for row, g in received.items():
        at = g["arrival_ns"] - t0_mono_ns
        assert at >= due_of[row] - 2_000_000, (row, at, due_of[row])  # 2 ms: clock reads
    arrival_order = sorted(received, key=lambda r: received[r]["arrival_ns"])
    dues = np.array([due_of[r] for r in arrival_order])
    # a request may overtake one due at most 100 ms before it (sent by another process at about
    # the same time); rows due at distinct trace times here are >= 150 ms apart
    assert (np.maximum.accumulate(dues) - dues).max() <= 100_000_000

    # byte-identical prompts per row to a single-process run of the same trace and seed
    received_single = _received_by_row(rec_single, trace)
    assert sorted(received_single) == list(range(n))
    for row in range(n):
        a, b = received[row], received_single[row]
        assert a["prompt"] == b["prompt"], f"row {row}: prompt differs"
        assert (a["max_tokens"], a["min_tokens"], a["ignore_eos"]) == (
            b["max_tokens"],
            b["min_tokens"],
            b["ignore_eos"],
        )
        assert len(a["prompt"]) == trace.input_length[row]

    # `replayer merge` of the shards == the single run, in counts and tokens
    merged = tmp_path / "merged"
    out = subprocess.run(
        [sys.executable, "-m", "replayer", "merge", *map(str, dirs), "-o", str(merged)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "Successful requests" in out.stdout
    m = json.loads((merged / "summary.json").read_text())
    s1 = json.loads((single / "summary.json").read_text())
    assert {k: m[k] for k in COUNT_FIELDS} == {k: s1[k] for k in COUNT_FIELDS}
    assert m["completed"] == n and m["prompt_token_mismatches"] == 0
    # each shard's prefix-cache model saw the other shards' rows: one server, one expectation
    assert m["expected_prefix_hit_tokens"] == s1["expected_prefix_hit_tokens"] > 0
    assert m["shards"] == [f"{i}/{SHARDS}" for i in range(SHARDS)]
    assert m["duplicate_rows"] == 0 and m["merge_warnings"] == []
    assert m["anchor_spread_s"] < 1e-3
    assert 0 < m["duration"] < 60
    # what the shards shared, and the one target's metrics (every shard scraped it)
    assert (m["target"], m["speedup"], m["trace"], m["model"]) == (url_sharded, SPEEDUP, s1["trace"], s1["model"])
    assert m["target_metrics"]["scrapes"] > 0 and m["server_prefix_cache_hit_tokens"] > 0
    # a merged folder holds only summary.json: its report reads the shards' results
    out = subprocess.run(
        [sys.executable, "-m", "replayer", "report", str(merged)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and (merged / "report.html").stat().st_size > 10_000, out.stderr

    # merge notices a missing shard, a folder given twice, and a shard cut short by a stop (a
    # Kubernetes retry resumes it later): exit 1, with the summary written all the same
    part = merge_results([str(dirs[0]), str(dirs[1])], quiet=True)
    assert any("2/3" in w for w in part["merge_warnings"])
    twice = merge_results([str(dirs[0]), str(dirs[0])], quiet=True)
    assert twice["duplicate_rows"] == len(tables[0])
    assert twice["merge_warnings"][0] == f"{dirs[0]} is given more than once: its rows are counted that many times"
    stopped = json.loads((dirs[2] / "summary.json").read_text())
    (dirs[2] / "summary.json").write_text(json.dumps({**stopped, "stopped_early": True, "stop_signal": "SIGTERM"}))
    for args in ([str(dirs[0]), str(dirs[0])], [str(dirs[0]), str(dirs[1])], list(map(str, dirs))):
        out = subprocess.run(
            [sys.executable, "-m", "replayer", "merge", *args, "-o", str(tmp_path / "m2")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 1 and "not one whole run" in out.stderr, out.stderr
        assert (tmp_path / "m2" / "summary.json").exists()
    assert f"{dirs[2]}: stopped early (SIGTERM)" in out.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "replayer", "merge", str(empty)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1 and "no results" in out.stderr


def test_workers_end_to_end(tmp_path, mooncake_slice):
    trace_path = mooncake_slice(20)
    n = len(read_trace(str(trace_path)))
    results = tmp_path / "res"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace_path),
            "--workers",
            "2",
            "--speedup",
            str(SPEEDUP),
            "--results",
            str(results),
            "--admin-port",
            "0",
            "--quiet",
            "--goodput",
            "ttft:60000",
            "e2el:600000",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads((results / "summary.json").read_text())
    assert s["completed"] == s["scheduled"] == n and s["failed"] == 0
    # every worker judged by the bounds (passed on), the merged verdict over all of them
    assert s["goodput_slos_ms"] == {"ttft": 60000.0, "e2el": 600000.0}
    assert s["slo_met"] == n and s["slo_attainment"] == 1.0
    assert s["request_goodput"] == pytest.approx(n / s["duration"])
    assert s["shards"] == ["0/2", "1/2"] and s["duplicate_rows"] == 0
    for i in range(2):
        w = json.loads((results / f"worker-{i}" / "summary.json").read_text())
        assert w["shard"] == f"{i}/2" and w["completed"] > 0 and w["slo_met"] == w["completed"]
        assert w["target_embedded"] is True  # the parent's simulator, given to it as --target
    # so a plain run on the embedded simulator (its own free port) is the same experiment
    from replayer.results.compare import setup_differences

    assert s["target_embedded"] is True
    plain = dict(s, target="http://127.0.0.1:1", target_embedded=True)
    assert setup_differences(plain, s) == []
    # the workers scraped the one target: the merged summary keeps that view (not a sum)
    assert s["target_metrics"]["scrapes"] > 0 and "server_prefix_cache_hit_tokens" in s
    rows = (
        read_results(str(results / "worker-0")).column("row").to_pylist()
        + read_results(str(results / "worker-1")).column("row").to_pylist()
    )
    assert sorted(rows) == list(range(n))


def _free_port_pair() -> int:
    """A free 127.0.0.1 port whose successor is free too."""
    import socket

    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


def test_workers_terminal_ctrl_c_drains_once(tmp_path, mooncake_slice):
    """A Ctrl-C at a terminal signals the whole foreground process group. The workers must get
    it once (drain: in-flight requests complete) and the simulator must outlive the drain."""
    trace_path = mooncake_slice(20)
    results = tmp_path / "res"
    port = _free_port_pair()  # worker i serves its admin port on port + i
    parent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace_path),
            "--workers",
            "2",
            "--speedup",
            "5",
            "--results",
            str(results),
            "--admin-port",
            str(port),
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_until_both_sent(parent, port)  # mid-dispatch (the schedule lasts 4 s)
        os.killpg(parent.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, err = parent.communicate(timeout=120)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
    assert parent.returncode == 128 + signal.SIGINT, err[-3000:]  # stopped, not finished: 130
    s = json.loads((results / "summary.json").read_text())
    assert s["stopped_early"] is True and s["stop_signal"] == "SIGINT"  # the merged summary says so
    assert s["sent"] > 0 and s["not_started"] > 0  # stopped early ...
    assert s["cancelled"] == 0 and s["failed"] == 0  # ... by draining: nothing cut off
    assert s["completed"] == s["sent"]
    assert "again: cancelling" not in err  # no worker saw a second signal


def test_workers_stop_when_their_parent_is_killed(tmp_path, mooncake_slice):
    """The workers run in sessions of their own: a SIGKILLed (or hung-up) parent must not leave
    them replaying with nothing in control. Each drains, writes its results and summary; the
    embedded simulator the parent started outlives their drain (no request fails)."""
    trace_path = mooncake_slice(60)
    results = tmp_path / "res"
    port = _free_port_pair()
    parent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace_path),
            "--workers",
            "2",
            "--speedup",
            "5",
            "--results",
            str(results),
            "--admin-port",
            str(port),
            "--quiet",
            "--drain-timeout",
            "20",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_until_both_sent(parent, port)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
            (results / f"worker-{i}" / "summary.json").exists() for i in range(2)
        ):
            time.sleep(0.1)
    finally:
        if parent.poll() is None:
            parent.kill()
    for i in range(2):
        w = json.loads((results / f"worker-{i}" / "summary.json").read_text())
        assert w["stopped_early"] is True and w["stop_signal"] == "SIGHUP" and w["sent"] > 0
        assert w["sent"] + w["not_started"] == w["scheduled"]
        assert w["failed"] == w["cancelled"] == 0 and w["completed"] == w["sent"], w.get("errors_by_kind")
    time.sleep(1.0)
    for i in range(2):  # and they are gone: nothing answers on their admin ports
        with pytest.raises(OSError):
            _status(port + i)


def _wait_until_both_sent(parent: subprocess.Popen, port: int, timeout_s: float = 60) -> None:
    """Until both workers of ``parent`` (admin ports ``port``, ``port + 1``) have sent something."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert time.monotonic() < deadline and parent.poll() is None, "workers did not start sending: " + (
            "" if parent.poll() is None or parent.stderr is None else parent.communicate()[1][-2000:]
        )
        try:
            if all(_status(port + i)["sent"] > 0 for i in range(2)):
                return
        except OSError:
            pass
        time.sleep(0.1)


def _status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as r:
        return json.loads(r.read())


def test_merge_puts_shards_on_one_time_axis(tmp_path):
    """Shards anchored 10 s apart (one pod started late): one time axis, a warning, and the
    merged duration is the time some run was replaying (1 s + 1 s, not the 11 s between)."""
    dirs = []
    for i, wall in enumerate((1000.0, 1010.0)):
        d = tmp_path / f"shard-{i}"
        d.mkdir()
        t = to_table(
            [
                RequestResult(
                    row=i,
                    due_ns=0,
                    sent_ns=0,
                    end_ns=1_000_000_000,
                    outcome="success",
                    prompt_tokens=5,
                    completion_tokens=3,
                    input_length=5,
                    output_length=3,
                    e2e_ms=1000.0 + 1000 * i,
                )
            ]
        )
        meta = {
            b"replayer.t0_wall_s": repr(wall).encode(),
            b"replayer.config": json.dumps({"shard": f"{i}/2", "goodput": ["e2el:1500"]}).encode(),
        }
        pq.write_table(t.replace_schema_metadata(meta), d / "requests.parquet")
        (d / "summary.json").write_text(json.dumps({"stopped_early": False}))  # each ran to its end
        dirs.append(str(d))
    s = merge_results(dirs, str(tmp_path / "m"), quiet=True)
    assert s["duration"] == pytest.approx(2.0) and s["request_throughput"] == pytest.approx(1.0)
    assert s["anchor_spread_s"] == pytest.approx(10.0)
    assert s["completed"] == 2 and s["total_output_tokens"] == 6
    # judged by the bounds in the files' metadata (the folders' summaries have none)
    assert (s["slo_met"], s["slo_missed"], s["slo_attainment"]) == (1, 1, 0.5)
    assert s["request_goodput"] == pytest.approx(0.5) and s["output_token_goodput"] == pytest.approx(1.5)
    assert s["shards"] == ["0/2", "1/2"]
    assert len(s["merge_warnings"]) == 1 and "10.000 s apart" in s["merge_warnings"][0]
    assert json.loads((tmp_path / "m" / "summary.json").read_text())["completed"] == 2


def test_merge_of_a_resumed_folder_is_not_a_late_shard(tmp_path):
    """Shard 1's folder holds its first run and a resume 500 s later: no 'anchored apart'
    warning (its first run started with shard 0's), and the 500 s gap is not replay time."""

    def write(d, name, wall, row, shard):
        d.mkdir(exist_ok=True)
        t = to_table(
            [
                RequestResult(
                    row=row,
                    due_ns=0,
                    sent_ns=0,
                    end_ns=2_000_000_000,
                    outcome="success",
                    prompt_tokens=5,
                    completion_tokens=3,
                    input_length=5,
                    output_length=3,
                )
            ]
        )
        meta = {b"replayer.t0_wall_s": repr(wall).encode(), b"replayer.config": json.dumps({"shard": shard}).encode()}
        pq.write_table(t.replace_schema_metadata(meta), d / name)
        (d / "summary.json").write_text(json.dumps({"stopped_early": False}))  # each ran to its end

    write(tmp_path / "s0", "requests.parquet", 1000.0, 0, "0/2")
    write(tmp_path / "s1", "requests.parquet", 1000.0, 1, "1/2")
    write(tmp_path / "s1", "requests-00000.parquet", 1500.0, 3, "1/2")
    s = merge_results([str(tmp_path / "s0"), str(tmp_path / "s1")], quiet=True)
    assert s["merge_warnings"] == [] and s["anchor_spread_s"] == 0.0
    assert s["duration"] == pytest.approx(4.0) and s["completed"] == 3


def test_worker_helpers():
    assert _without_flag(["t.jsonl", "--resume", "r", "--seed", "1"], "--resume") == ["t.jsonl", "--seed", "1"]
    assert _exit_code(0) == 0 and _exit_code(2) == 2 and _exit_code(-signal.SIGKILL) == 137
    assert max(_exit_code(c) for c in (0, -9)) == 137  # a killed worker is not a success


def test_workers_progress_lines_sum_the_workers_status(caplog):
    """``--workers`` logs one line every few seconds from its workers' /status (real HTTP
    servers here); a worker that has finished counts with its last answer."""
    import http.server
    import threading

    answers = [
        {"sent": 7, "scheduled": 10, "in_flight": 2, "completed": 4, "failed": 1, "dispatch_lag_max_s": 0.0004},
        {"sent": 5, "scheduled": 5, "in_flight": 0, "completed": 5, "failed": 0, "dispatch_lag_max_s": 0.00125},
    ]
    servers = []
    for a in answers:
        body = json.dumps(a).encode()

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self, body=body):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        srv = http.server.HTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
    ports = [srv.server_address[1] for srv in servers]
    procs = [subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({t})"]) for t in (2.5, 1.2)]
    threading.Timer(0.9, lambda: (servers[1].shutdown(), servers[1].server_close())).start()
    caplog.set_level("INFO", logger="replayer.run.workers")
    try:
        _progress(procs, ports, start_at=time.time(), every_s=0.5)
    finally:
        servers[0].shutdown()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) >= 3, lines
    assert lines[0].endswith("sent 12/15 in-flight 2 ok 9 failed 1 max lag 1.2 ms (2 of 2 workers running)")
    assert lines[-1].endswith("sent 12/15 in-flight 2 ok 9 failed 1 max lag 1.2 ms (1 of 2 workers running)")
    assert all(p.poll() is not None for p in procs)
    # a worker that has not answered yet, or whose scheduled count is known only at its end
    assert progress_line([answers[0], None], 3.0, 2).startswith("t=3s sent 7/? in-flight 2 ok 4 failed 1")
    assert "sent 12/?" in progress_line([answers[0], {**answers[1], "scheduled": 0}], 3.0, 2)


def test_merge_wait_returns_when_every_run_has_ended_by_itself(tmp_path):
    import threading

    from replayer.results.mergecheck import unfinished, wait_finished

    a, b = tmp_path / "a", tmp_path / "b"  # b does not exist yet (its pod not started)
    a.mkdir()
    (a / "summary.json").write_text(json.dumps({"stopped_early": True, "stop_signal": "SIGTERM"}))
    assert "stopped early (SIGTERM)" in unfinished(str(a)) and "no summary.json" in unfinished(str(b))
    assert wait_finished([str(a), str(b)], 0.3, poll_s=0.05) == [str(a), str(b)]  # gives up in time

    def finish():
        (a / "summary.json").write_text(json.dumps({"stopped_early": False}))  # resumed to its end
        b.mkdir()
        (b / "summary.json").write_text(json.dumps({"stopped_early": False}))

    threading.Timer(0.5, finish).start()
    t0 = time.monotonic()
    assert wait_finished([str(a), str(b)], 30, poll_s=0.05) == []
    assert 0.4 < time.monotonic() - t0 < 5


def test_workers_with_a_bad_trace_exit_2_and_leave_nothing(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
        '{"timestamp": 5, "input_length": -3, "output_length": 5, "hash_ids": [1]}\n'
    )
    results = tmp_path / "res"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(bad),
            "--workers",
            "2",
            "--admin-port",
            "0",
            "--results",
            str(results),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "row 2: input_length" in out.stderr and "embedded simulator" not in out.stderr  # (checked first)
    assert "merge failed" not in out.stderr and not results.exists()


def test_merge_keeps_the_target_metrics_of_the_folder_that_saw_most_of_the_run(tmp_path):
    """Two shards scraped one server 5 times each; shard 0 ended first. The merged deltas are
    shard 1's, which cover the whole run (a tie on scrapes took the first folder's)."""
    dirs = []
    for i, (first, last, done) in enumerate(((100.0, 120.0, 198), (100.0, 125.0, 200))):
        d = tmp_path / f"shard-{i}"
        d.mkdir()
        t = to_table(
            [
                RequestResult(
                    row=i,
                    due_ns=0,
                    sent_ns=0,
                    end_ns=1_000_000_000,
                    outcome="success",
                    prompt_tokens=5,
                    completion_tokens=3,
                    input_length=5,
                    output_length=3,
                )
            ]
        )
        meta = {b"replayer.t0_wall_s": b"1000.0", b"replayer.config": json.dumps({"shard": f"{i}/2"}).encode()}
        pq.write_table(t.replace_schema_metadata(meta), d / "requests.parquet")
        (d / "summary.json").write_text(
            json.dumps(
                {
                    "stopped_early": False,
                    "target": "http://vllm:8000",
                    "target_metrics": {
                        "scrapes": 5,
                        "first_scrape_s": first,
                        "last_scrape_s": last,
                        "deltas": {"request_success": done},
                    },
                }
            )
        )
        dirs.append(str(d))
    s = merge_results(dirs, quiet=True)
    assert s["target_metrics"]["deltas"]["request_success"] == 200 and s["target"] == "http://vllm:8000"


def test_workers_max_error_ratio_and_quiet_print_the_merged_outcome(tmp_path, mooncake_slice):
    """--workers with every request failing (a wrong --endpoint: 404): exit 3 over the merged
    summary; --quiet still prints the outcome, once (the merged summary, not each worker's)."""
    trace_path = mooncake_slice(20)
    results = tmp_path / "res"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace_path),
            "--workers",
            "2",
            "--endpoint",
            "/v1/nope",
            "--max-requests",
            "6",
            "--max-error-ratio",
            "0.5",
            "--speedup",
            str(SPEEDUP),
            "--results",
            str(results),
            "--admin-port",
            "0",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 3, out.stderr[-3000:]
    assert "6 of 6 requests failed (100.0%; http_status 6), more than --max-error-ratio 0.5: exit 3" in out.stderr
    assert out.stdout.count("Replay result") == 1 and f"merged 2 of 2 workers: {results}/summary.json" in out.stdout
    for i in range(2):  # each worker ran to its end (it does not judge its shard alone)
        assert json.loads((results / f"worker-{i}" / "summary.json").read_text())["failed"] > 0


def test_readers_of_results_do_not_import_the_supervisor():
    # report, merge and summary read results; the --workers supervisor (process handling,
    # signals) is not theirs to load
    import ast
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[1] / "replayer"
    for name in ("report", "merge", "summary"):
        tree = ast.parse((pkg / "results" / f"{name}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {"workers", "replayer.run.workers", "daemon", "replayer.run.daemon"} & imported, name


def test_each_worker_keeps_its_share_of_the_retention_bound():
    """--retain-size bounds the whole results folder; with --workers N it holds N worker folders,
    so each worker gets 1/N (the flag comes after the user's, and the last one given wins)."""
    from replayer.cli import build_parser
    from replayer.config import load_config
    from replayer.run.workers import worker_shares

    trace = "traces/mooncake_conversation_10min.parquet"
    cfg = load_config({"trace": trace, "retain_size": "2GB", "roll_interval_s": 600, "workers": 4})
    assert worker_shares(cfg) == ["--retain-size", "500000000"]
    assert worker_shares(load_config({"trace": trace, "retain_size": "2GB", "roll_interval_s": 600})) == []
    assert worker_shares(load_config({"trace": trace, "workers": 4})) == []
    args = build_parser().parse_args(["run", trace, "--retain-size", "2GB", *worker_shares(cfg)])
    assert args.retain_size == "500000000"
