"""A quiet embedded simulator (issue 47): it exports what the replayer scrapes (no "target metrics
missing" warning against it), and it starts only once the run's own checks (trace, folder, port)
have passed, so a start-up error is not preceded by "serving at"."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from conftest import SHORT_OUTPUT

import replayer.record.lock as folder_lock


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "replayer", "run", *args], capture_output=True, text=True, timeout=120)


def test_a_run_on_the_embedded_simulator_warns_of_no_missing_metric(tmp_path, mooncake_slice):
    trace = mooncake_slice(3, max_output=SHORT_OUTPUT)
    p = _run(str(trace), "--speedup", "20", "--results", str(tmp_path / "r"), "--admin-port", "0")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "missing" not in p.stderr, p.stderr[-2000:]  # (no target-metrics warning: the simulator exports them)
    tm = json.loads((tmp_path / "r" / "summary.json").read_text())["target_metrics"]
    assert tm["deltas"]["server_ttft_seconds_count"] == tm["deltas"]["server_e2e_seconds_count"] > 0
    assert tm["deltas"]["num_preemptions"] == 0
    assert all(m.startswith("spec_decode_") for m in tm["missing"])  # (only with speculative decoding on)


def test_the_simulator_starts_only_after_the_runs_own_checks(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": -3, "output_length": 5, "hash_ids": [1]}\n')
    good = tmp_path / "good.jsonl"
    good.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        busy_port = _run(str(good), "--results", str(tmp_path / "a"), "--admin-port", port)
    held = tmp_path / "held"
    held.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import replayer.record.lock as l, sys; l.acquire({str(held)!r}); print(1, flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "1"
        busy_folder = _run(str(good), "--results", str(held), "--admin-port", "0")
    finally:
        holder.kill()
        holder.wait(10)
    bad_trace = _run(str(bad), "--results", str(tmp_path / "b"), "--admin-port", "0")
    for p, why in ((bad_trace, "input_length"), (busy_port, f"--admin-port {port}"), (busy_folder, "being written")):
        assert p.returncode == 2 and why in p.stderr, p.stderr[-2000:]
        assert "serving at" not in p.stderr and "embedded simulator" not in p.stderr, p.stderr[-2000:]
    assert folder_lock.holder(str(held))["pid"] == holder.pid  # (the refused run left its lock alone)
