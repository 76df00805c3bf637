"""Progress while waiting (issue 47): while requests are in flight and none ends, a line every
``--stall-log-interval`` s names how many wait and the oldest one's age, with ``--quiet`` too; the
read timeout's default is in ``run --help``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import replay_against
from faultserver import HANG, Plan, ThreadedFaultServer

from replayer.observe.stall import StallCheck


def test_the_stall_line_is_due_each_interval_without_an_end_and_never_while_requests_end():
    c = StallCheck(30, read_timeout_s=600)
    assert c.check(0, 5, 0, 1.0) is None  # (the stretch begins)
    assert c.check(29, 5, 0, 30.0) is None
    line = c.check(31, 5, 0, 32.4)
    assert line == (
        "no request has ended for 31 s: 5 in flight; the oldest was due 32 s ago "
        "(--read-timeout 600 s fails a request silent that long)"
    )
    assert c.check(40, 5, 0, 41.0) is None and c.check(61, 5, 0, 62.0) is not None  # once per interval
    assert c.check(62, 5, 1, 1.0) is None and c.check(91, 5, 1, 30.0) is None  # one ended: a new stretch
    assert c.check(93, 0, 1, None) is None and c.check(200, 0, 1, None) is None  # nothing in flight: no line


def test_a_hanging_target_is_said_with_quiet_before_the_read_timeout(tmp_path, mooncake_slice):
    trace = mooncake_slice(5)
    with ThreadedFaultServer(Plan(transcript=[(0, HANG)])) as srv:
        p = replay_against(
            trace, srv.url, tmp_path / "r", "--max-requests", "3", "--speedup", "50", "--read-timeout", "5",
            "--stall-log-interval", "1",
        )  # fmt: skip
    assert p.returncode == 3, p.stderr[-2000:]  # (all 3 failed by the read timeout: nothing measured)
    lines = [x for x in p.stderr.splitlines() if "no request has ended for" in x]
    assert lines, p.stderr[-2000:]
    m = re.search(r"no request has ended for (\d+) s: (\d) in flight; the oldest was due (\d+) s ago", lines[0])
    assert m and int(m[1]) >= 1 and int(m[2]) >= 1 and int(m[3]) >= 1, lines[0]
    assert "--read-timeout 5 s" in lines[0]


def test_run_help_states_the_read_timeouts_default():
    env = dict(os.environ, COLUMNS="100")
    out = subprocess.run([sys.executable, "-m", "replayer", "run", "--help"], capture_output=True, text=True, env=env)
    assert re.search(r"--read-timeout SECONDS\s+idle timeout.*?\[default: 600\.0\]", out.stdout, re.S)
    assert "--stall-log-interval" in out.stdout or "stall line" in out.stdout
