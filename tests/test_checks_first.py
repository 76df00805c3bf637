"""``--workers`` and ``replayer sweep`` make their children's checks of the trace and settings
before they start anything: bad input exits 2 naming what is wrong, and no embedded simulator
(nor any worker or point) was ever started to be stopped again."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replayer.run.precheck import input_problem, port_problem

BAD_ROWS = (
    '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
    '{"timestamp": 5, "input_length": -3, "output_length": 5, "hash_ids": [1]}\n'
)


def _children_sims(pid: int) -> set[int]:
    """The ``replayer sim`` processes started by process ``pid`` (their ``--parent-pid``), now."""
    found = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"sim" in argv
            and b"--parent-pid" in argv
            and argv[argv.index(b"--parent-pid") + 1 :][:1] == [str(pid).encode()]
        ):
            found.add(int(d.name))
    return found


def _watched(*args: str) -> tuple[subprocess.CompletedProcess, set[int]]:
    """``replayer ARGS`` run to its end, /proc watched meanwhile for a simulator it started."""
    p = subprocess.Popen(
        [sys.executable, "-m", "replayer", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    sims: set[int] = set()
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline:
        sims |= _children_sims(p.pid)
        time.sleep(0.005)
    out, err = p.communicate(timeout=60)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err), sims


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="watches /proc for the simulator's process")
def test_workers_and_sweep_refuse_a_bad_trace_before_starting_a_simulator(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(BAD_ROWS)
    for args in (
        ["run", str(bad), "--workers", "2", "--admin-port", "0", "--results", str(tmp_path / "w"), "--quiet"],
        [
            "sweep",
            str(bad),
            "--speedups",
            "1,2",
            "--goodput",
            "e2el:1000",
            "--admin-port",
            "0",
            "--results",
            str(tmp_path / "s"),
        ],
    ):
        p, sims = _watched(*args)
        assert p.returncode == 2, (args[0], p.stderr[-2000:])
        assert "row 2: input_length" in p.stderr, p.stderr[-2000:]
        assert not sims and "serving at" not in p.stderr and "embedded simulator" not in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "w").exists() and not (tmp_path / "s").exists()  # (no folder made either)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="watches /proc for the simulator's process")
def test_workers_and_sweep_refuse_a_busy_admin_port_before_starting_a_simulator(tmp_path, mooncake_slice):
    trace = mooncake_slice(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert port_problem("127.0.0.1", [port]).startswith(f"--admin-port {port} on 127.0.0.1: ")
        for args in (  # (worker 1 would bind the port after --admin-port)
            ["run", str(trace), "--workers", "2", "--admin-port", str(port - 1), "--results", str(tmp_path / "w")],
            [
                "sweep",
                str(trace),
                "--speedups",
                "1",
                "--goodput",
                "e2el:1000",
                "--admin-port",
                str(port),
                "--results",
                str(tmp_path / "s"),
            ],
        ):
            p, sims = _watched(*args)
            named = f"--admin-port {port} on 127.0.0.1" in p.stderr or f"--admin-port {port - 1} on " in p.stderr
            assert p.returncode == 2 and named, (args[0], p.stderr[-2000:])
            assert not sims and "serving at" not in p.stderr, p.stderr[-2000:]
            if args[0] == "run":  # (the trace's 1 s grid: said by each worker, not by the parent's check)
                assert "grid" not in p.stderr, p.stderr[-2000:]
    assert port_problem("127.0.0.1", [0]) is None


def test_the_checks_name_the_trace_and_start_nothing(tmp_path):
    from replayer.config import load_config

    bad = tmp_path / "bad.jsonl"
    bad.write_text(BAD_ROWS)
    why = input_problem(load_config({"trace": str(bad)}))
    assert why is not None and "row 2: input_length" in why
    good = tmp_path / "good.jsonl"
    good.write_text(BAD_ROWS.splitlines()[0] + "\n")
    assert input_problem(load_config({"trace": str(good)})) is None
