"""Self-checks that speak (issue 47): a stream that arrives all at once (a buffering proxy) is
said and counted; trace timestamps on a grid coarser than 1 ms are warned about at run time; the
launcher process dying mid-run is logged, not passed over."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess

import numpy as np
from conftest import replay_against
from faultserver import DONE, Plan, ThreadedFaultServer, choice
from test_launcher import _rig

from replayer.core import now_ns
from replayer.run.inputs import coarse_grid

USAGE = {"prompt_tokens": 4, "completion_tokens": 3}
# every event of the stream in one write: what a client behind a buffering proxy receives
AT_ONCE = Plan(transcript=[(150, choice("a") + choice("b") + choice("c", finish="length", usage=USAGE) + DONE)])
STREAMED = Plan(
    transcript=[(0, choice("a")), (20, choice("b")), (40, choice("c", finish="length", usage=USAGE)), (41, DONE)]
)


def _trace(tmp_path, timestamps_ms) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 4, "output_length": 3, "hash_ids": [i]}) + "\n"
            for i, t in enumerate(timestamps_ms)
        )
    )
    return str(path)


def _run(tmp_path, trace: str, url: str, name: str) -> subprocess.CompletedProcess:
    return replay_against(trace, url, tmp_path / name, "--speedup", "10")


def test_streams_that_arrive_all_at_once_are_said_and_counted(tmp_path):
    trace = _trace(tmp_path, [0, 7, 13, 21, 29])
    with ThreadedFaultServer(AT_ONCE) as srv:
        buffered = _run(tmp_path, trace, srv.url, "at-once")
    with ThreadedFaultServer(STREAMED) as srv:
        streamed = _run(tmp_path, trace, srv.url, "streamed")
    assert buffered.returncode == streamed.returncode == 0, buffered.stderr[-2000:] + streamed.stderr[-2000:]
    assert "streamed responses arrived all at once" in buffered.stderr
    assert json.loads((tmp_path / "at-once" / "summary.json").read_text())["buffered_streams"] == {
        "at_once": 5,
        "streams": 5,
    }
    assert "arrived all at once" not in streamed.stderr
    assert "buffered_streams" not in json.loads((tmp_path / "streamed" / "summary.json").read_text())


def test_a_trace_on_a_coarse_grid_is_warned_about_at_run_time(tmp_path):
    assert coarse_grid(np.array([0, 100_000_000, 300_000_000])) == "100 ms"
    assert coarse_grid(np.array([0, 1_000_000, 3_000_000])) is None  # (1 ms: Mooncake's own grid)
    assert coarse_grid(np.array([0])) is None
    with ThreadedFaultServer(STREAMED) as srv:
        coarse = _run(tmp_path, _trace(tmp_path, [0, 1000, 1000, 2000]), srv.url, "coarse")
    assert coarse.returncode == 0, coarse.stderr[-2000:]
    assert "the trace's timestamps are on a 1 s grid" in coarse.stderr


def test_the_launcher_dying_mid_run_is_logged(caplog):
    async def main():
        async with _rig(1) as (launcher, socks, _, got, event):
            launcher.submit(now_ns() + 10_000_000_000, socks[0].fileno(), b"late", b"")
            pid = launcher._proc.pid  # type: ignore[union-attr]
            os.kill(pid, signal.SIGKILL)
            await asyncio.wait_for(event.wait(), 5)
            return pid

    with caplog.at_level(logging.ERROR, logger="replayer"):
        pid = asyncio.run(main())
    [line] = [r.getMessage() for r in caplog.records if "launcher process" in r.getMessage()]
    assert line.startswith(f"the launcher process (pid {pid}) died mid-run (killed by SIGKILL): the 1 requests")
