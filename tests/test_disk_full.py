"""A disk that fills is a failure mode like any other: the run ends with its summary computed from
what is on disk plus what is held in memory, printed, written where it fits (else said printed
only), a documented exit code (``EXIT_WRITE_FAILED``), and a later ``--resume`` on a disk with
room completes it. Each case fills a real (tiny tmpfs) disk: at the start, during the run, while
``summary.json`` is written; and the capture's writer (``replayer record``) on a full disk."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

import replayer.record.rolling as rolling
import replayer.run.finish as finish
from replayer.config import load_config
from replayer.record import read_results
from replayer.record.rolling import EXIT_WRITE_FAILED
from replayer.run import main_run

N = 60  # requests of the test trace, 40 ms apart
#: ``replayer`` in a child whose rows left unwritten are tried again for 1 s at the end (30 s in a
#: real run: ``rolling.CLOSE_RETRY_S``), as ``short_retry`` does in this process
SHORT_RETRY = (
    sys.executable,
    "-c",
    "import sys, replayer.record.rolling as r; r.CLOSE_RETRY_S = 1.0; "
    "from replayer.cli import main; sys.exit(main(sys.argv[1:]))",
)


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1,200 KiB tmpfs (mounted for the test, unmounted after); skipped where mount is not allowed."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs (a real disk that fills)")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(folder) -> None:
    """Write a file in ``folder`` until the disk is full (ENOSPC)."""
    with contextlib.suppress(OSError), open(os.path.join(folder, "filler"), "ab") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(
            json.dumps({"timestamp": i * 40, "input_length": 16, "output_length": 4, "hash_ids": [i]}) + "\n"
            for i in range(N)
        )
    )
    return str(path)


def _cfg(trace: str, url: str, **kw):
    return load_config(
        {
            "trace": trace,
            "target": [url],
            "block_size": 16,
            "admin_port": 0,
            "quiet": True,
            "flush_interval_s": 0.1,
            "scrape_target_metrics": False,
            **kw,
        }
    )


@pytest.fixture(autouse=True)
def short_retry(monkeypatch):
    monkeypatch.setattr(rolling, "CLOSE_RETRY_S", 1.0)  # (30 s in a run)


def _resume_on_roomy_disk(folder, roomy, trace, url) -> dict:
    shutil.copytree(folder, roomy)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(roomy, "filler"))
    assert main_run(_cfg(trace, url, resume=str(roomy))) == 0
    rows = read_results(str(roomy), columns=["row"]).column("row").to_pylist()
    assert sorted(rows) == list(range(N))  # every row, once
    summary = json.loads((roomy / "summary.json").read_text())
    assert summary["completed"] == N
    return summary


def test_disk_full_during_the_run_summary_printed_exit_code_and_resume_completes(
    tiny_disk, trace, sim_process, tmp_path, capsys
):
    url, _ = sim_process("--ttft-base-ms", "5", "--itl-base-ms", "1")
    res = tiny_disk / "res"
    filled = threading.Event()

    def fill_after_first_part() -> None:  # the disk fills once the run has written something
        while not filled.is_set():
            if (res / "parts").is_dir() and any((res / "parts").glob("part-*.parquet")):
                fill(tiny_disk)
                filled.set()
            filled.wait(0.01)

    watcher = threading.Thread(target=fill_after_first_part, daemon=True)
    watcher.start()
    code = main_run(_cfg(trace, url, results=str(res)))
    filled.set()
    watcher.join()
    out = capsys.readouterr()
    assert code == EXIT_WRITE_FAILED, out.err[-3000:]
    assert "Traceback" not in out.err
    assert "Successful requests" in out.out  # the summary is printed
    assert f"results: {res}/" in out.out and "results not all written" in out.out
    assert "not on disk" in out.out and "summary.json not written" in out.out
    on_disk = read_results(str(res), columns=["row"]).num_rows
    assert 0 < on_disk < N  # some results reached the disk, the rest was held in memory
    assert not (res / "summary.json").exists()
    _resume_on_roomy_disk(res, tmp_path / "roomy", trace, url)


def test_disk_full_at_the_start_counts_every_result_from_memory(tiny_disk, trace, sim_process, capsys):
    url, _ = sim_process("--ttft-base-ms", "5", "--itl-base-ms", "1")
    res = tiny_disk / "res"
    res.mkdir()
    fill(tiny_disk)
    code = main_run(_cfg(trace, url, results=str(res)))
    out = capsys.readouterr()
    assert code == EXIT_WRITE_FAILED, out.err[-3000:]
    assert "Traceback" not in out.err
    assert f"{N} results held in memory and counted above are not on disk" in out.out
    sent = next(line for line in out.out.splitlines() if line.startswith("Successful requests"))
    assert sent.split()[-1] == str(N)  # every result counted, though none is on disk
    assert "no checkpoint.json" in out.out  # nothing to resume: the run is told to run again


def test_disk_full_while_writing_summary_json(tiny_disk, trace, sim_process, tmp_path, capsys, monkeypatch):
    url, _ = sim_process("--ttft-base-ms", "5", "--itl-base-ms", "1")
    res = tiny_disk / "res"
    real = finish.write_json

    def fill_first(path, obj, **kw):  # the disk fills just before summary.json
        fill(tiny_disk)
        real(path, obj, **kw)

    monkeypatch.setattr(finish, "write_json", fill_first)
    code = main_run(_cfg(trace, url, results=str(res)))
    out = capsys.readouterr()
    assert code == EXIT_WRITE_FAILED, out.err[-3000:]
    assert "summary.json not written (No space left on device)" in out.out
    assert "Successful requests" in out.out and "Traceback" not in out.err
    assert read_results(str(res), columns=["row"]).num_rows == N  # the results themselves are on disk
    assert not (res / "summary.json").exists() and not (res / "summary.json.tmp").exists()
    monkeypatch.setattr(finish, "write_json", real)
    summary = _resume_on_roomy_disk(res, tmp_path / "roomy", trace, url)
    assert summary["sent"] == N


def test_capture_writer_on_a_full_disk_ends_without_raising(tiny_disk, caplog):
    from replayer.capture.writer import CaptureWriter

    out = tiny_disk / "cap"
    w = CaptureWriter(str(out), {"replayer.block_size": "16", "replayer.time_unit": "ns"})
    for i in range(5):
        w.add({"timestamp": i, "input_length": 10, "output_length": 2, "hash_ids": [i], "outcome": "ok"})
    w.flush().result()  # one part on disk
    assert w.rows_written == 5
    fill(tiny_disk)
    w.add({"timestamp": 9, "input_length": 10, "output_length": 2, "hash_ids": [9], "outcome": "ok"})
    w.close()  # (raised OSError ENOSPC from the last roll before)
    assert w.unwritten_rows == 1 and w.roll_error is not None and "No space left" in w.roll_error
    assert any("1 captured rows could not be written" in r.getMessage() for r in caplog.records)
    assert list((out / "parts").glob("part-*.parquet"))  # the part stays, readable


def _complete(url: str, i: int) -> int:
    import urllib.request

    body = json.dumps({"model": "sim-model", "prompt": [1, 2, 3, 4, i], "max_tokens": 2}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()
        return r.status


def test_record_on_a_disk_that_fills_ends_with_exit_5_and_no_traceback(tiny_disk, sim_process):
    import signal

    from test_capture_roundtrip import start_record

    upstream, _ = sim_process("--ttft-base-ms", "5", "--itl-base-ms", "1")
    out = tiny_disk / "cap"
    p, url = start_record(out, upstream, "--flush-interval", "0.2", "--block-size", "4", replayer=SHORT_RETRY)
    try:
        assert _complete(url, 0) == 200
        deadline = time.monotonic() + 60
        while not list((out / "parts").glob("part-*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.05)
        fill(tiny_disk)  # the disk fills with a row on disk and one still to write
        assert _complete(url, 1) == 200
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)  # (the unwritten row is tried again for 1 s)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == EXIT_WRITE_FAILED, err[-3000:]
    assert "Traceback" not in err
    assert "1 captured rows could not be written (lost)" in err and "the last roll failed" in err


def test_record_on_a_full_disk_at_the_start_is_a_start_up_error(tiny_disk, sim_process):
    upstream, _ = sim_process()
    fill(tiny_disk)
    p = subprocess.run(
        [sys.executable, "-m", "replayer", "record", "--upstream", upstream, "--listen", "127.0.0.1:0"]
        + ["--admin-port", "0", "--out", str(tiny_disk / "cap")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "cannot write there: No space left on device" in p.stderr
