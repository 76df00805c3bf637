"""A stopped ``--loop forever`` soak counts and plots what was scheduled up to the stop, not the
rest of a pass it never reached: the summary's ``scheduled``, the results' due times and the
report's header, for the stopped run and for its resumed run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from replayer.results import read_results
from replayer.results.report import render_html

ROWS = 20  # a pass: 20 requests 100 ms apart (2 s)


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "replayer", "run", *args, "--admin-port", "0", "--quiet", "--no-scrape-target-metrics"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop_in_pass(p: subprocess.Popen, res, loop: int, row: int) -> subprocess.CompletedProcess:
    """SIGTERM once the checkpoint says pass ``loop`` reached ``row`` (flushed every 0.1 s)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        try:
            ckpt = json.loads((res / "checkpoint.json").read_text())
        except (OSError, ValueError):
            ckpt = {}
        if (ckpt.get("loop", -1), ckpt.get("next_row", -1)) >= (loop, row):
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _check(res, summary: dict) -> None:
    t = read_results(str(res), columns=["loop", "row", "outcome", "due_ns", "sent_ns", "end_ns"]).to_pylist()
    assert len({(r["loop"], r["row"]) for r in t}) == len(t)  # each (pass, row) once
    # what is counted as scheduled is what was sent, and what was due and not sent by the stop
    assert summary["scheduled"] == summary["sent"] + summary["not_started"] == len(t)
    assert summary["not_started"] <= 2  # (a request due as the stop came), never the rest of a pass
    html = render_html(str(res))
    assert f"{len(t):,} requests scheduled" in html


def test_a_stopped_forever_loop_and_its_resume_count_what_was_scheduled_up_to_the_stop(tmp_path, sim_process):
    url, _ = sim_process("--ttft-base-ms", "20", "--itl-base-ms", "1")
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": i * 100, "input_length": 16, "output_length": 2, "hash_ids": [i]}) + "\n"
            for i in range(ROWS)
        )
    )
    res = tmp_path / "res"
    common = ["--target", url, "--loop", "forever", "--flush-interval", "0.1"]
    p = _stop_in_pass(_start([str(trace), "--results", str(res), *common]), res, loop=1, row=5)
    assert p.returncode == 143, p.stderr[-3000:]
    first = json.loads((res / "summary.json").read_text())
    assert first["stopped_early"] is True and first["sent"] > ROWS  # stopped in the second pass
    assert first["scheduled"] < 2 * ROWS  # not the whole second pass
    _check(res, first)
    rows = read_results(str(res), columns=["due_ns", "end_ns"])
    last_end = max(rows.column("end_ns").to_pylist(), key=lambda v: v or 0)
    assert max(rows.column("due_ns").to_pylist()) <= last_end  # the due line ends by the stop

    p = _stop_in_pass(_start(["--resume", str(res), *common]), res, loop=2, row=5)
    assert p.returncode == 143, p.stderr[-3000:]
    second = json.loads((res / "summary.json").read_text())
    assert second["sent"] > first["sent"] and second["scheduled"] < 3 * ROWS
    _check(res, second)
