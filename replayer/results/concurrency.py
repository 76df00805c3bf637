"""Peak concurrency: the most requests in flight at once, exact, from each request's send and end
times (``sent_ns``, ``end_ns``), and the instant it was first reached.

A request is in flight over ``[sent, end)``: at an instant where one ends and another starts, the
one that ended no longer counts, so the two count once. A request whose send or end time is
unknown (not started; an end never recorded) is left out, as is one that took no time. The runs
of a folder (a resumed run has its own anchor) and merged folders (workers, shards) are put on
one axis by their anchors' wall-clock times: exact within one run, within the clocks' agreement
across processes. Memory: 16 bytes per request swept.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True, slots=True)
class Peak:
    """``requests`` in flight at once, first reached ``at_ns`` after the axis origin, the earliest
    run anchor, whose wall-clock time is ``t0_wall_s`` (None when unknown)."""

    requests: int
    at_ns: int | None
    t0_wall_s: float | None = None

    def fields(self) -> dict[str, int | float | None]:
        """The summary's fields: ``max_concurrent_requests``, ``max_concurrent_requests_at_s``
        (seconds after the first run's start), ``max_concurrent_requests_at_unix_s`` (wall clock)."""
        at_s = self.at_ns / 1e9 if self.at_ns is not None else None
        return {
            "max_concurrent_requests": self.requests,
            "max_concurrent_requests_at_s": at_s,
            "max_concurrent_requests_at_unix_s": (
                round(self.t0_wall_s + at_s, 6) if at_s is not None and self.t0_wall_s is not None else None
            ),
        }


def peak_in_flight(sent_ns: Iterable[int] | np.ndarray, end_ns: Iterable[int] | np.ndarray) -> tuple[int, int | None]:
    """(the most requests in flight at once, the first instant it was reached; None when no
    request was in flight) over the intervals ``[sent_ns[i], end_ns[i])``. An end and a start
    at the same instant: the end goes first (the two count once). Intervals with ``end <= sent``
    take no time and are left out."""
    s = np.asarray(sent_ns, dtype=np.int64)
    e = np.asarray(end_ns, dtype=np.int64)
    keep = e > s
    s, e = s[keep], e[keep]
    if not s.size:
        return 0, None
    times = np.concatenate([s, e])
    steps = np.concatenate([np.ones(s.size, np.int64), -np.ones(e.size, np.int64)])
    order = np.lexsort((steps, times))  # by time, then ends (-1) before starts (+1)
    level = np.cumsum(steps[order])
    i = int(np.argmax(level))  # the first index of the highest level
    return int(level[i]), int(times[order][i])


class PeakFold:
    """Send and end times gathered on one time axis (each table's shifted by ``shift_ns``: a
    resumed run or a worker has an anchor of its own), then swept (``peak``)."""

    def __init__(self) -> None:
        self._sent: list[np.ndarray] = []
        self._end: list[np.ndarray] = []

    def add(self, table: pa.Table | pa.RecordBatch, shift_ns: int = 0) -> None:
        """Add the rows of ``table`` (columns ``sent_ns`` and ``end_ns``; a table without them
        adds nothing), their times plus ``shift_ns``; warm-up rows (``warmup`` true) are left out,
        as from every statistic of a run."""
        if not {"sent_ns", "end_ns"} <= set(table.schema.names):
            return
        sent, end = table.column("sent_ns"), table.column("end_ns")
        known = pc.and_(pc.is_valid(sent), pc.is_valid(end))
        if "warmup" in table.schema.names:
            known = pc.and_(known, pc.invert(pc.fill_null(table.column("warmup"), False)))
        for col, out in ((sent, self._sent), (end, self._end)):
            out.append(np.asarray(pc.filter(col, known).to_numpy(zero_copy_only=False), dtype=np.int64) + shift_ns)

    def peak(self, t0_wall_s: float | None = None) -> Peak:
        """The peak on this axis, whose origin is the wall-clock time ``t0_wall_s``."""
        if not self._sent:
            return Peak(0, None, t0_wall_s)
        n, at = peak_in_flight(np.concatenate(self._sent), np.concatenate(self._end))
        return Peak(n, at, t0_wall_s)


def _wall(pf_or_table) -> float | None:
    """A results file's (or table's) run anchor, ``replayer.t0_wall_s`` (Unix s), or None."""
    schema = pf_or_table.schema_arrow if hasattr(pf_or_table, "schema_arrow") else pf_or_table.schema
    raw = (schema.metadata or {}).get(b"replayer.t0_wall_s")
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def peak_of_files(files: list[str], held: pa.Table | None = None) -> Peak:
    """The peak over results files (damaged ones left out: they are reported elsewhere) and the
    results ``held`` in memory (a full disk), every run placed on the axis of the earliest run
    anchor by its wall-clock start (a resumed run after its first; workers side by side)."""
    from replayer.record.folder import open_file

    opened = []
    for f in files:
        pf = open_file(f)
        if pf is not None and {"sent_ns", "end_ns"} <= set(pf.schema_arrow.names):
            opened.append((pf, _wall(pf)))
    tables = [(held, _wall(held))] if held is not None and held.num_rows else []
    walls = [w for _, w in opened + tables if w is not None]
    base = min(walls) if walls else None

    def shift(wall: float | None) -> int:
        return round((wall - base) * 1e9) if wall is not None and base is not None else 0

    fold = PeakFold()
    for pf, wall in opened:
        try:
            cols = ["sent_ns", "end_ns", *(["warmup"] if "warmup" in pf.schema_arrow.names else [])]
            fold.add(pf.read(columns=cols), shift(wall))
        except (OSError, pa.ArrowException):
            continue
    for t, wall in tables:
        fold.add(t, shift(wall))
    return fold.peak(base)
