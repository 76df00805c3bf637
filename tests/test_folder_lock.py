"""One writer per results folder (issue 47): two runs started at once on one folder, and
``--resume`` on a folder whose run is still going, each leave every row once and refuse the
second writer (exit 2, naming the holder); a stale lock is taken over with a warning; where the
filesystem has no locks, the record is the lock; ``merge -o`` into a running folder is refused."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections import Counter

import pytest
from conftest import SHORT_OUTPUT

import replayer.record.lock as folder_lock
from replayer.record import read_results

#: a process holding FOLDER's lock until its stdin closes
HOLDER = """
import sys
import replayer.record.lock as folder_lock
folder_lock.acquire(sys.argv[1])
print("held", flush=True)
sys.stdin.read()
"""


def _run(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "replayer", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _rows(folder) -> Counter:
    t = read_results(str(folder), columns=["loop", "row", "outcome"])
    return Counter(zip(t.column("loop").to_pylist(), t.column("row").to_pylist(), strict=True))


def _common(url: str) -> list[str]:
    return ["--target", url, "--admin-port", "0", "--quiet", "--no-scrape-target-metrics", "--flush-rows", "2"]


def test_two_runs_started_at_once_on_one_folder_one_is_refused_and_every_row_is_there_once(
    tmp_path, mooncake_slice, sim_process
):
    trace = mooncake_slice(30, max_output=SHORT_OUTPUT)
    n = sum(1 for _ in open(trace))
    url, _ = sim_process("--itl-base-ms", "1")
    res = tmp_path / "r"
    runs = [_run(str(trace), "--results", str(res), "--speedup", "6", *_common(url)) for _ in range(2)]
    outs = [p.communicate(timeout=180) for p in runs]
    codes = sorted(p.returncode for p in runs)
    assert codes == [0, 2], [(p.returncode, e[-2000:]) for p, (_, e) in zip(runs, outs, strict=True)]
    loser = next(e for p, (_, e) in zip(runs, outs, strict=True) if p.returncode == 2)
    winner = next(p for p in runs if p.returncode == 0)
    assert "is being written by PID" in loser and f"PID {winner.pid} on host {socket.gethostname()}" in loser
    rows = _rows(res)
    assert len(rows) == n and set(rows.values()) == {1}
    summary = json.loads((res / "summary.json").read_text())
    assert summary["scheduled"] == summary["completed"] == n
    assert not (res / folder_lock.LOCK_FILE).exists()  # released at the end


def test_resume_on_a_folder_whose_run_is_going_is_refused_and_every_row_is_there_once(
    tmp_path, mooncake_slice, sim_process
):
    trace = mooncake_slice(30)
    n = sum(1 for _ in open(trace))
    url, _ = sim_process("--itl-base-ms", "1")
    res = tmp_path / "r"
    first = _run(str(trace), "--results", str(res), "--speedup", "5", *_common(url))
    deadline = time.monotonic() + 60
    while not (res / "checkpoint.json").exists():  # it has recorded rows: a resume would skip them
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.stderr else ""
        time.sleep(0.05)
    second = subprocess.run(
        [sys.executable, "-m", "replayer", "run", "--resume", str(res), str(trace), *_common(url)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.poll() is None, "the first run ended before the resume was tried: make it longer"
    assert second.returncode == 2, second.stderr[-2000:]
    assert f"--resume {res} is being written by PID {first.pid}" in second.stderr
    assert "Traceback" not in second.stderr
    _, err = first.communicate(timeout=180)
    assert first.returncode == 0, err[-2000:]
    rows = _rows(res)
    assert len(rows) == n and set(rows.values()) == {1}
    assert json.loads((res / "summary.json").read_text())["completed"] == n


def test_a_held_folder_names_its_holder_and_a_stale_lock_is_taken_over_with_a_warning(tmp_path, caplog):
    folder = tmp_path / "r"
    folder.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(folder_lock.FolderBusy, match=f"PID {holder.pid} on host {socket.gethostname()} since 20"):
            folder_lock.acquire(str(folder))
        holder.kill()  # SIGKILL: no clean-up, its record stays; the kernel drops its flock
        holder.wait(10)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert folder_lock.holder(str(folder))["pid"] == holder.pid  # (stale)
    with caplog.at_level(logging.WARNING, logger="replayer"):
        with folder_lock.hold(str(folder)):
            assert folder_lock.holder(str(folder))["pid"] == os.getpid()
            with folder_lock.hold(str(folder)):  # re-entrant in one process (the --workers parent's merge)
                pass
            assert folder_lock.held(str(folder))
    assert f"taking over a stale lock of PID {holder.pid}" in caplog.text
    assert not (folder / folder_lock.LOCK_FILE).exists()


def test_where_the_filesystem_has_no_locks_the_record_is_the_lock(tmp_path, monkeypatch, caplog):
    # (no filesystem without flock at hand: flock is made to answer as such a mount does)
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    folder = tmp_path / "r"
    folder.mkdir()
    lock_file = folder / folder_lock.LOCK_FILE
    lock_file.write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(), "started": "T"}))
    with pytest.raises(folder_lock.FolderBusy, match="does not lock files: remove .*replayer.lock"):
        folder_lock.acquire(str(folder))
    lock_file.write_text(json.dumps({"pid": 1, "host": "another-host", "started": "T"}))
    with pytest.raises(folder_lock.FolderBusy, match="PID 1 on host another-host"):
        folder_lock.acquire(str(folder))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock_file.write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname(), "started": "T"}))
    with caplog.at_level(logging.WARNING, logger="replayer"), folder_lock.hold(str(folder)):
        assert folder_lock.holder(str(folder))["pid"] == os.getpid()
    assert "that process is gone" in caplog.text and "does not lock files" in caplog.text


def test_merge_into_a_folder_a_run_is_writing_is_refused(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        p = subprocess.run(
            [sys.executable, "-m", "replayer", "merge", str(tmp_path), "-o", str(folder)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        holder.kill()
        holder.wait(10)
    assert p.returncode == 2, p.stderr
    assert f"is being written by PID {holder.pid}" in p.stderr
