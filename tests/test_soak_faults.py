"""Soak faults at the daemon level (``python -m replayer run`` as a process): the target restarts
mid-run (with and without retries), and a failing target with an API key set (the key never
leaks; failures are logged as bursts, never one line per request; JSON log lines)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pyarrow.parquet as pq
from conftest import free_port, wait_http


def _sim(port: int, *args: str) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-m", "replayer", "sim", "--host", "127.0.0.1", "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_http(f"http://127.0.0.1:{port}/health", 20)
    return p


def _sim_on_cue(port: int, *args: str) -> subprocess.Popen:
    """``replayer sim`` (the same CLI entry) in a process that imports everything now and starts
    serving when a line arrives on its stdin: a restart ~0.2 s after the cue instead of the 2-6 s
    a cold Python start takes on a busy 2-core machine."""
    code = (
        "import sys; from replayer.cli import main; sys.stdin.readline(); "
        f"sys.exit(main(['sim', '--host', '127.0.0.1', '--port', '{port}', *{list(args)!r}]))"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def _run(args: list[str], env=None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "replayer", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _json_lines(err: str) -> list[dict]:
    """Every stderr line must be one JSON object (--log-format json)."""
    return [json.loads(line) for line in err.splitlines() if line.strip()]


def _restart_run(tmp_path, mooncake_slice, extra: list[str]):
    """Replay 300 s of trace at 15x (~40 requests/s) against a sim on a fixed port; SIGKILL the
    sim about 1 s into the replay, start a new one on the same port 1 s later, and stop the
    replay over the admin API 1.5 s after the new one answers (``POST /stop``: the rest is
    recorded ``not_started``). Returns (rows, n, t0_wall_s, kill_wall, back_wall, stderr)."""
    trace = mooncake_slice(300)
    n = sum(1 for _ in open(trace))
    port, admin = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    sims = [_sim(port, "--itl-base-ms", "2"), _sim_on_cue(port, "--itl-base-ms", "2")]
    res = tmp_path / "r"
    p = _run(
        [
            str(trace),
            "--target",
            url,
            "--speedup",
            "15",
            "--results",
            str(res),
            "--admin-port",
            str(admin),
            "--quiet",
            "--start-delay",
            "0.3",
            "--warm-connections",
            "16",
            "--connect-timeout",
            "2",
            "--scrape-interval",
            "0.5",
            "--flush-interval",
            "0.5",
            "--log-format",
            "json",
            "--drain-timeout",
            "20",
            *extra,
        ],
        env={k: v for k, v in os.environ.items() if "REPLAYER_" not in k},
    )
    try:
        wait_http(f"http://127.0.0.1:{admin}/readyz", 30)
        time.sleep(1.3)
        kill_wall = time.time()
        sims[0].send_signal(signal.SIGKILL)
        sims[0].wait(10)
        time.sleep(1.0)
        sims[1].stdin.write("go\n")
        sims[1].stdin.flush()
        wait_http(f"{url}/health", 20)
        back_wall = time.time()
        time.sleep(1.5)
        req = urllib.request.Request(f"http://127.0.0.1:{admin}/stop", method="POST", data=b"")
        urllib.request.urlopen(req, timeout=10).read()
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        for s in sims:
            _stop(s)
    assert p.returncode == 0, err[-3000:]
    table = pq.read_table(res / "requests.parquet")
    t0_wall = float(table.schema.metadata[b"replayer.t0_wall_s"])
    return table.to_pylist(), n, t0_wall, kill_wall, back_wall, err


def test_target_restart_mid_run_is_recorded_and_the_replay_continues(tmp_path, mooncake_slice):
    rows, n, t0, kill_wall, back_wall, err = _restart_run(tmp_path, mooncake_slice, [])
    assert sorted(r["row"] for r in rows) == list(range(n))  # every row exactly once
    sent = [r for r in rows if r["outcome"] != "not_started"]
    assert {r["outcome"] for r in sent} <= {"success", "failed"}  # drained: nothing cancelled
    failed = [r for r in sent if r["outcome"] == "failed"]
    assert failed, "the outage must show"
    # (a request written on a reused connection just as the target died gets no response byte:
    # stale_connection, as a keep-alive race would)
    outage = {"connect", "disconnect", "stale_connection"}
    assert {r["error_kind"] for r in failed} <= outage, {r["error_kind"] for r in failed}
    assert any(r["error_kind"] == "connect" for r in failed)  # sent while nothing listened
    due_wall = lambda r: t0 + r["due_ns"] / 1e9  # noqa: E731
    end_wall = lambda r: t0 + r["end_ns"] / 1e9  # noqa: E731
    # failures belong to the outage: they ended after the kill (in flight then, or sent while the
    # target was down) and were due before the new sim answered
    assert all(kill_wall - 0.2 < end_wall(r) and due_wall(r) < back_wall + 0.3 for r in failed)
    assert all(r["outcome"] == "success" for r in sent if end_wall(r) < kill_wall - 0.2)
    assert any(end_wall(r) < kill_wall for r in sent)  # the target worked before
    # ... and again after the restart: the replay continued
    after = [r for r in sent if due_wall(r) > back_wall + 0.3]
    assert len(after) >= 10 and all(r["outcome"] == "success" for r in after)
    assert all(r["retries"] == 0 for r in rows)  # retries are off by default
    logs = _json_lines(err)
    assert all({"ts", "level", "logger", "msg"} <= set(o) for o in logs)
    starts = [o for o in logs if o["msg"].startswith("requests started failing with")]
    assert {o["error_kind"] for o in starts} <= outage and starts
    assert len(logs) < 40 and len(logs) < len(failed) + 15 or len(failed) < 10  # not one per failure


def test_target_restart_with_retries_recovers_requests_that_could_not_connect(tmp_path, mooncake_slice):
    rows, n, t0, kill_wall, back_wall, err = _restart_run(
        tmp_path, mooncake_slice, ["--retry-max", "8", "--retry-backoff", "0.1"]
    )
    assert sorted(r["row"] for r in rows) == list(range(n))
    retried = [r for r in rows if r["retries"] > 0]
    assert retried and all(r["outcome"] == "success" for r in retried if r["error_kind"] != "disconnect")
    # nothing was lost to CONNECT: 0.1 * (2**8 - 1) = 25.5 s of backoff outlast the ~1.2 s outage
    assert not [r for r in rows if r["error_kind"] == "connect"]
    # what still fails was cut mid-stream (output had arrived: never retried)
    for r in rows:
        if r["outcome"] == "failed":
            assert r["error_kind"] == "disconnect" and r["retries"] == 0, r
    # TTFT/E2E of a retried request run from its last send (at least one 0.1 s backoff after its
    # due time); dispatch lag is its first send's (the same send when the earlier attempts could
    # not connect)
    for r in retried:
        last_lag_ms = (r["sent_ns"] - r["due_ns"]) / 1e6
        assert last_lag_ms >= 95 and last_lag_ms >= r["dispatch_lag_ms"] - 1e-3, r
        if r["outcome"] == "success":
            assert t0 + r["sent_ns"] / 1e9 > back_wall - 1.0 and r["ttft_ms"] < 3000


def test_failing_target_never_leaks_the_api_key(tmp_path, mooncake_slice):
    secret = "sk-soak-secret-987654321"
    trace = mooncake_slice(30)
    port, admin = free_port(), free_port()
    sim = _sim(port, "--max-model-len", "64")  # every request: HTTP 400
    env = dict(os.environ, REPLAYER_API_KEY=secret)
    res = tmp_path / "r"
    p = _run(
        [
            str(trace),
            "--target",
            f"http://127.0.0.1:{port}",
            "--speedup",
            "10",
            "--results",
            str(res),
            "--admin-port",
            str(admin),
            "--start-delay",
            "0.3",
            "--log-format",
            "json",
            "--warm-connections",
            "4",
            "--scrape-interval",
            "0.5",
            "--max-error-ratio",  # (every request fails here: without it the run exits 3, issue 47)
            "1",
        ],
        env=env,
    )
    statuses = []
    try:
        wait_http(f"http://127.0.0.1:{admin}/readyz", 30)
        for _ in range(3):
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/status", timeout=5) as r:
                statuses.append(r.read().decode())
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as r:
                statuses.append(r.read().decode())
            time.sleep(0.5)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        _stop(sim)
    assert p.returncode == 0, err[-3000:]
    rows = pq.read_table(res / "requests.parquet").to_pylist()
    assert rows and all(r["outcome"] == "failed" and r["http_status"] == 400 for r in rows)
    assert secret not in out and secret not in err
    assert all(secret not in s for s in statuses) and json.loads(statuses[0])["failed"] >= 0
    for f in res.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    logs = _json_lines(err)
    burst = [o for o in logs if o.get("error_kind") == "http_status"]
    assert burst and burst[0]["msg"].startswith("requests started failing with http_status (HTTP 400)")
    assert len(burst) <= 3 < len(rows)  # never one line per request
