"""The run's events on the report's time axes: the one place that turns what happened when in a
run into marks on its figures.

A run's events are ``summary.json``'s ``events`` (``replayer.observe.events``: start, warm-up end,
loop, pause, resume, speed-up change, target restart, stop) and the loop boundaries its results
files show (each later loop's first due time, exact on the trace's clock). ``run_marks`` turns
them into ``Mark``s on the report's axis (seconds after the earliest run anchor), each event once:
a loop boundary from the results files where they show it (a ``loop`` column, the loop before
it there too), else from its event (older files; loops whose files retention removed);
the same kind and label within ``SAME_S`` of each other (each shard of a ``--workers`` run
records its own start, loops and stop) drawn once. ``add_marks`` gives them to every figure spec
with a time axis; ``draw_marks`` draws them on a plotly figure: a dotted vertical line labelled
at its top ("loop 1", "speed-up 5x", "pause"), one colour per kind, and one legend entry per
kind that names it ("loop boundary", "pause", ...; a click on it hides that kind).

Pure but ``draw_marks``, which takes the plotly figure it draws on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["KINDS", "SAME_S", "Mark", "add_marks", "draw_marks", "run_marks"]

#: each event kind's legend name and colour (every kind of ``replayer.observe.events.EVENTS``)
KINDS: dict[str, tuple[str, str]] = {
    "start": ("run start", "#2ca02c"),
    "warmup_end": ("warm-up end", "#7f7f7f"),
    "loop": ("loop boundary", "#1f77b4"),
    "pause": ("pause", "#d62728"),
    "resume": ("resume", "#ff7f0e"),
    "speedup": ("speed-up change", "#9467bd"),
    "target_restart": ("target restart", "#8c564b"),
    "stop": ("run stop", "#17becf"),
}

#: marks of one kind and label closer than this (s) are one event (a --workers run's shards)
SAME_S = 1.0


@dataclass(frozen=True, slots=True, order=True)
class Mark:
    """One event on the time axes: ``x`` seconds on the report's axis, ``kind`` (a key of
    ``KINDS``), ``label`` (what its line says)."""

    x: float
    kind: str
    label: str


def _label(e: dict[str, Any]) -> str:
    kind = e["event"]
    if kind == "loop" and isinstance(e.get("loop"), int):
        return f"loop {e['loop']}"
    if kind == "speedup" and isinstance(e.get("speedup"), (int, float)):
        return f"speed-up {e['speedup']:g}x"
    return KINDS[kind][0]


def _x(e: dict[str, Any], origin_wall_s: float | None) -> float | None:
    """An event's place on the report's axis: its Unix time less the axis origin, else its
    ``t_s`` (seconds after its run's anchor: the axis of a run of one anchor)."""
    if origin_wall_s is not None and isinstance(e.get("time_s"), (int, float)):
        return float(e["time_s"]) - origin_wall_s
    return float(e["t_s"]) if isinstance(e.get("t_s"), (int, float)) else None


def run_marks(summary: dict, loop_starts: dict[int, float], origin_wall_s: float | None) -> list[Mark]:
    """The marks of a run (module docstring), in time order. ``summary``: its ``summary.json``;
    ``loop_starts``: each loop's first due time on the report's axis (``ReportData.loop_starts``;
    {} when the results have no loop column); ``origin_wall_s``: the axis origin (Unix s)."""
    first = min(loop_starts, default=0)
    seen = {k: x for k, x in loop_starts.items() if k > first}  # (one loop alone shows no boundary)
    marks = [Mark(float(x), "loop", f"loop {k}") for k, x in sorted(seen.items())]
    for e in summary.get("events") or ():
        if not isinstance(e, dict) or e.get("event") not in KINDS or (e["event"] == "loop" and e.get("loop") in seen):
            continue  # (a loop the results show: its exact boundary is marked above)
        x = _x(e, origin_wall_s)
        if x is not None:
            marks.append(Mark(x, e["event"], _label(e)))
    if "events" not in summary:  # (a summary from before the events: its speed-up changes)
        for c in summary.get("speedup_changes") or ():
            if isinstance(c, dict) and isinstance(c.get("speedup"), (int, float)) and (x := _x(c, None)) is not None:
                marks.append(Mark(x, "speedup", _label({"event": "speedup", "speedup": c["speedup"]})))
    return _once(sorted(marks))


def _once(marks: list[Mark]) -> list[Mark]:
    """``marks`` (sorted) less those of a kind and label already marked within ``SAME_S``."""
    last: dict[tuple[str, str], float] = {}
    out = []
    for m in marks:
        key = (m.kind, m.label)
        if key in last and m.x - last[key] < SAME_S:
            continue
        last[key] = m.x
        out.append(m)
    return out


def add_marks(specs: list[dict], marks: list[Mark], shift_s: float = 0.0) -> None:
    """Give ``marks`` to the figure specs with a time axis (an ``x_title`` naming time), each
    moved by ``-shift_s`` (a figure whose axis starts ``shift_s`` after the report's)."""
    if not marks:
        return
    moved = [Mark(m.x - shift_s, m.kind, m.label) for m in marks] if shift_s else list(marks)
    for sp in specs:
        if "time" in sp["x_title"]:
            sp["marks"] = moved


#: the labels of successive marks go in this many rows at the top (events close in time: a pause
#: just after the start, a loop boundary beside a speed-up change), ``LABEL_ROW_PX`` apart
LABEL_ROWS, LABEL_ROW_PX = 3, 14


def draw_marks(fig: Any, marks: list[Mark]) -> None:
    """Draw ``marks`` (in time order) on the plotly figure ``fig``: a dotted vertical line per
    mark, labelled at its top (successive labels in ``LABEL_ROWS`` rows, so close ones do not
    overlap), in its kind's colour; the first mark of each kind also names the kind in the legend."""
    shown: set[str] = set()
    for i, m in enumerate(marks):
        name, colour = KINDS[m.kind]
        fig.add_vline(
            x=m.x,
            line={"dash": "dot", "width": 1.5, "color": colour},
            annotation={
                "text": m.label,
                "font": {"color": colour, "size": 11},
                "yshift": -LABEL_ROW_PX * (i % LABEL_ROWS),
            },
            annotation_position="top",
            name=name,
            legendgroup=f"event-{m.kind}",
            showlegend=m.kind not in shown,
        )
        shown.add(m.kind)
