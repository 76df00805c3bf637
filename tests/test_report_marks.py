"""The run's events on the report's time axes (``replayer.results.reportmarks``): one mechanism
for every kind (loop boundaries, pauses, speed-up changes, start, stop, ...), each event drawn
once on every figure with a time axis, with a legend entry naming its kind."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request

import plotly.graph_objects as go
import pytest
from conftest import free_port, wait_http
from test_report import CHROMIUM, _dump_dom

from replayer.observe.events import EVENTS
from replayer.results.report import write_report
from replayer.results.reportmarks import KINDS, Mark, add_marks, draw_marks, run_marks


def test_every_kind_of_run_event_has_a_mark_style():
    assert set(KINDS) == set(EVENTS)
    assert len({name for name, _ in KINDS.values()}) == len({colour for _, colour in KINDS.values()}) == len(KINDS)


def test_a_runs_events_become_marks_each_once():
    events = [
        {"event": "start", "time_s": 100.0},
        {"event": "start", "time_s": 100.2, "folder": "worker-1"},  # (a second shard's: the same event)
        {"event": "loop", "time_s": 131.0, "loop": 1},  # (the results' exact boundary is used instead)
        {"event": "pause", "time_s": 140.0},
        {"event": "resume", "time_s": 141.5},
        {"event": "speedup", "time_s": 142.0, "speedup": 40.0},
        {"event": "target_restart", "time_s": 150.0, "target": "http://t"},
        {"event": "stop", "time_s": 160.0},
        {"event": "a_later_kind", "time_s": 161.0},  # (a kind this report does not know: left out)
    ]
    marks = run_marks({"events": events, "speedup_changes": [{"t_s": 42.0, "speedup": 40.0}]}, {0: 0.0, 1: 30.0}, 100.0)
    assert [(m.x, m.kind, m.label) for m in marks] == [
        (0.0, "start", "run start"),
        (30.0, "loop", "loop 1"),
        (40.0, "pause", "pause"),
        (41.5, "resume", "resume"),
        (42.0, "speedup", "speed-up 40x"),
        (50.0, "target_restart", "target restart"),
        (60.0, "stop", "run stop"),
    ]
    # loops 0 and 1 removed by retention: their boundaries from the events, the later ones exact
    looped = {"events": [{"event": "loop", "t_s": t, "loop": k} for k, t in ((1, 20.0), (2, 50.3), (3, 80.4))]}
    assert [(m.x, m.label) for m in run_marks(looped, {2: 50.0, 3: 80.0}, None)] == [
        (20.0, "loop 1"),
        (50.3, "loop 2"),
        (80.0, "loop 3"),
    ]
    # results without a loop column: the loop events mark the boundaries; no anchor: t_s
    assert run_marks({"events": [{"event": "loop", "t_s": 31.0, "loop": 1}]}, {}, None) == [
        Mark(31.0, "loop", "loop 1")
    ]
    # a summary from before the events: its speed-up changes
    old = {"speedup_changes": [{"t_s": 12.5, "speedup": 5}, {"t_s": "?", "speedup": 2}]}
    assert run_marks(old, {0: 0.0}, 100.0) == [Mark(12.5, "speedup", "speed-up 5x")]
    assert run_marks({}, {0: 0.0}, None) == []


def test_marks_go_on_every_time_axis_and_are_drawn_once_per_kind_in_the_legend():
    specs = [
        {"x_title": "time since start (s)"},
        {"x_title": "seconds"},
        {"x_title": "send time (s since the first request)"},
    ]
    marks = [Mark(10.0, "loop", "loop 1"), Mark(20.0, "loop", "loop 2"), Mark(15.0, "pause", "pause")]
    add_marks(specs, marks)
    add_marks(specs[2:], marks, shift_s=4.0)  # (an axis that starts 4 s after the report's)
    assert specs[0]["marks"] == marks and "marks" not in specs[1]
    assert [m.x for m in specs[2]["marks"]] == [6.0, 16.0, 11.0]
    fig = go.Figure()
    draw_marks(fig, marks)
    assert [s.x0 for s in fig.layout.shapes] == [10.0, 20.0, 15.0]
    assert [a.text for a in fig.layout.annotations] == ["loop 1", "loop 2", "pause"]
    assert [a.yshift for a in fig.layout.annotations] == [0, -14, -28]  # (close labels in rows, apart)
    assert [(s.name, s.showlegend) for s in fig.layout.shapes] == [
        ("loop boundary", True),
        ("loop boundary", False),
        ("pause", True),
    ]


def _post(url: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(url, method="POST", data=json.dumps(body).encode() if body else b"")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def _sent(base: str) -> int:
    with urllib.request.urlopen(base + "/status", timeout=5) as r:
        return int(json.loads(r.read())["sent"] or 0)


def _figures(dom: str) -> dict[str, str]:
    """Each drawn figure's DOM, by its title."""
    out = {}
    for part in re.split(r'<div id="fig\d+" class="plotly-graph-div', dom)[1:]:
        title = re.search(r'class="gtitle"[^>]*>([^<]*)<', part)
        assert title, part[:500]
        out[title.group(1)] = part
    return out


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium; .ci/run installs it)")
def test_a_report_of_a_looped_run_with_a_pause_marks_each_event_once(tmp_path, mooncake_slice):
    """A real run (two loops on the embedded simulator, paused and resumed, sped up) and its
    report drawn in headless Chromium: every time-axis figure shows each of the run's events
    once, with one legend entry per kind; the figures without a time axis show none."""
    trace = mooncake_slice(10)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    res = tmp_path / "r"
    p = subprocess.Popen(
        [
            sys.executable, "-m", "replayer", "run", str(trace), "--speedup", "2", "--loop", "2",
            "--results", str(res), "--admin-port", str(port), "--quiet", "--scrape-interval", "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        wait_http(base + "/readyz", 60)
        deadline = time.monotonic() + 60
        while _sent(base) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _post(base + "/pause")["paused"] is True
        time.sleep(0.5)
        _post(base + "/resume")
        _post(base + "/speedup", {"speedup": 40})
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-2000:]
    summary = json.loads((res / "summary.json").read_text())
    kinds = [e["event"] for e in summary["events"]]
    assert {"start", "loop", "pause", "resume", "speedup", "stop"} <= set(kinds), kinds
    assert kinds.count("pause") == kinds.count("resume") == kinds.count("loop") == 1
    labels = ["run start", "loop 1", "pause", "resume", "speed-up 40x", "run stop"]
    legend = ["run start", "loop boundary", "pause", "resume", "speed-up change", "run stop"]
    figs = _figures(_dump_dom(write_report(str(res))))
    timed = [t for t in figs if not t.startswith("Latency CDFs")]
    assert len(timed) >= 4 and "Arrivals: due vs sent vs completed" in timed and "Latency CDFs" in figs
    for title in timed:
        drawn = re.findall(r'class="annotation-text"[^>]*>([^<]*)<', figs[title])
        named = re.findall(r'class="legendtext"[^>]*>([^<]*)<', figs[title])
        for label in labels:
            assert drawn.count(label) == 1, (title, label, drawn)
        for name in legend:
            assert named.count(name) == 1, (title, name, named)
    cdf = figs["Latency CDFs"]
    assert "annotation-text" not in cdf and not any(
        n in re.findall(r'class="legendtext"[^>]*>([^<]*)<', cdf) for n in legend
    )
