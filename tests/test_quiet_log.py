"""``--quiet`` means only what needs attention (issue 47): no INFO log line on stderr, while
warnings (the stall line among them: ``tests/test_stall_line.py`` runs it with ``--quiet``) and
the summary are still written; an explicit ``--log-level`` wins over it."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import SHORT_OUTPUT

from replayer.config import load_config

_INFO = re.compile(r"^\S+ \S+ INFO ", re.M)  # the text format: <date> <time> INFO <logger>: ...


def _run(tmp_path, trace, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable, "-m", "replayer", "run", str(trace), "--max-requests", "5", "--speedup", "50",
            "--results", str(tmp_path / "r"), "--admin-port", "0", *flags,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip


def test_quiet_writes_no_info_line_against_the_embedded_simulator(tmp_path, mooncake_slice):
    trace = mooncake_slice(5, max_output=SHORT_OUTPUT)
    p = _run(tmp_path, trace, "--quiet")
    assert p.returncode == 0, p.stderr[-2000:]
    assert not _INFO.search(p.stderr), p.stderr[-2000:]
    assert re.search(r"^Successful requests +5$", p.stdout, re.M), p.stdout[-2000:]  # (the summary is printed)


def test_quiet_with_an_explicit_log_level_keeps_that_level(tmp_path, mooncake_slice):
    trace = mooncake_slice(5, max_output=SHORT_OUTPUT)
    p = _run(tmp_path, trace, "--quiet", "--log-level", "info")
    assert p.returncode == 0, p.stderr[-2000:]
    assert _INFO.search(p.stderr), p.stderr[-2000:]  # (so the test above can fail: INFO lines exist)


def test_the_log_threshold_is_warning_under_quiet_unless_a_level_is_given(mooncake_slice):
    base = {"trace": str(mooncake_slice(1))}
    assert load_config(base).log_threshold == "info"
    assert load_config({**base, "quiet": True}).log_threshold == "warning"
    assert load_config({**base, "quiet": True, "log_level": "debug"}).log_threshold == "debug"
    assert load_config({**base, "quiet": True, "log_level": "info"}).log_threshold == "info"
    assert load_config({**base, "log_level": "error"}).log_threshold == "error"
