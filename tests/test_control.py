"""Live control over the admin port, and secrets that never leak."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pyarrow.parquet as pq
from conftest import free_port, wait_http
from prometheus_client.parser import text_string_to_metric_families


def _post(url, token=None, body=None):
    req = urllib.request.Request(url, method="POST", data=json.dumps(body).encode() if body else b"")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def _status(base):
    with urllib.request.urlopen(base + "/status", timeout=5) as r:
        return json.loads(r.read())


def test_pause_resume_speedup_stop_with_token(tmp_path, mooncake_slice, sim_process):
    trace = mooncake_slice(120)
    url, _ = sim_process()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, REPLAYER_CONTROL_TOKEN="s3cret-token", REPLAYER_API_KEY="sk-very-secret-key-123")
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace),
            "--target",
            url,
            "--speedup",
            "4",
            "--results",
            str(tmp_path / "r"),
            "--admin-port",
            str(port),  # (not --quiet: every control change is checked in the log, at INFO)
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_http(base + "/readyz", 30)
        for token, says in ((None, "control needs a token"), ("wrong", "wrong bearer token")):
            try:
                _post(base + "/pause", token)
                raise AssertionError("control without the token must be refused")
            except urllib.error.HTTPError as e:
                assert e.code == 401 and says in e.read().decode()
        time.sleep(1.0)
        paused_at = time.monotonic()
        st = _post(base + "/pause", "s3cret-token")
        assert st["paused"] is True and st["state"] == "paused"
        # one unit convention in /status: seconds (as the quantiles)
        assert "dispatch_lag_max_s" in st and "dispatch_lag_p50_s" in st
        assert not [k for k in st if k.endswith("_ms")]
        time.sleep(0.3)
        sent = _status(base)["sent"]
        time.sleep(1.5)
        assert _status(base)["sent"] == sent  # nothing issued while paused
        _post(base + "/resume", "s3cret-token")
        paused_ms = (time.monotonic() - paused_at) * 1e3  # >= 1.8 s: the run's pause (or longer)
        st = _post(base + "/speedup", "s3cret-token", {"speedup": 40})
        assert st["speedup"] == 40 and st["paused"] is False and st["state"] == "running"
        time.sleep(1.0)
        assert _status(base)["sent"] > sent
        for path in ("/healthz", "/metrics", "/status"):  # open without a token
            with urllib.request.urlopen(base + path, timeout=5) as r:
                assert r.status == 200
        with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
            exported = {s.name: s for f in text_string_to_metric_families(r.read().decode()) for s in f.samples}
        assert exported["replayer_speedup"].value == 40  # now
        assert exported["replayer_config_info"].labels["speedup"] == "4.0"  # as started
        assert _post(base + "/stop", "s3cret-token")["state"] == "draining"
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-2000:]
    # every change is logged, and summary.json keeps the speed-up changes with their times
    for said in (
        "refused: wrong bearer token",
        "paused (POST /pause) at t=",
        "resumed (POST /resume) at t=",
        "speed-up 4 -> 40 (POST /speedup) at t=",
        "stopping (POST /stop) at t=",
    ):
        assert said in err, said
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["speedup"] == 4 and [c["speedup"] for c in s["speedup_changes"]] == [40]
    assert 1.0 < s["speedup_changes"][0]["t_s"] < s["duration"] + 60
    rows = pq.read_table(tmp_path / "r" / "requests.parquet").to_pylist()
    lags = [r["dispatch_lag_ms"] for r in rows if r["dispatch_lag_ms"] is not None]
    # pause/resume/speed-up re-anchor: no burst of late requests. Without it, the requests due
    # during the pause go at the resume, the first ~a whole pause late (and a speed-up 4 -> 40
    # kept on the old anchor makes a trace's next minute overdue at once); half the pause is
    # far more than a busy machine holds up the replayer's sends
    assert max(lags) < paused_ms / 2, (max(lags), paused_ms)
    # the API key never appears in what the run wrote or printed
    secret = "sk-very-secret-key-123"
    assert secret not in out and secret not in err
    for f in (tmp_path / "r").rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
