"""Peak concurrency: the most requests in flight at once, exact, from each request's send and end
times (``sent_ns``, ``end_ns``), and the instant it was first reached.

A request is in flight over ``[sent, end)``: at an instant where one ends and another starts, the
one that ended no longer counts, so the two count once. A request whose send or end time is
unknown (not started; an end never recorded) is left out, as is one that took no time. Each run
of a results folder (a resumed run has its own anchor, its own time axis) is swept on its own;
the folder's peak is the highest of its runs'. Memory: 16 bytes per request swept.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True, slots=True)
class Peak:
    """``requests`` in flight at once, first reached ``at_ns`` after the anchor of the run whose
    wall-clock start is ``t0_wall_s`` (None when unknown)."""

    requests: int
    at_ns: int | None
    t0_wall_s: float | None = None

    def fields(self) -> dict[str, int | float | None]:
        """The summary's fields: ``max_concurrent_requests``, ``max_concurrent_requests_at_s``
        (seconds after the run's start), ``max_concurrent_requests_at_unix_s`` (wall clock)."""
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
    """Send and end times gathered run by run (keyed by the run's anchor, ``replayer.t0_wall_s``
    in the file metadata), then swept (``peak``)."""

    def __init__(self) -> None:
        self._runs: dict[bytes, tuple[list[np.ndarray], list[np.ndarray]]] = {}

    def add(self, table: pa.Table | pa.RecordBatch, run: bytes = b"") -> None:
        """Add the rows of ``table`` (columns ``sent_ns`` and ``end_ns``) to run ``run``."""
        sent, end = table.column("sent_ns"), table.column("end_ns")
        known = pc.and_(pc.is_valid(sent), pc.is_valid(end))
        sent, end = pc.filter(sent, known), pc.filter(end, known)
        ss, ee = self._runs.setdefault(run, ([], []))
        ss.append(np.asarray(sent.to_numpy(zero_copy_only=False), dtype=np.int64))
        ee.append(np.asarray(end.to_numpy(zero_copy_only=False), dtype=np.int64))

    def peak(self) -> Peak | None:
        """The highest peak over the runs (the earliest run's when tied); None with no row added."""
        best: Peak | None = None
        for run, (ss, ee) in sorted(self._runs.items(), key=lambda kv: _wall(kv[0]) or 0.0):
            if not ss:
                continue
            n, at = peak_in_flight(np.concatenate(ss), np.concatenate(ee))
            if best is None or n > best.requests:
                best = Peak(n, at, _wall(run))
        return best


def _wall(run: bytes) -> float | None:
    """A run key (``replayer.t0_wall_s``: the anchor's Unix time, as text) as a float."""
    try:
        return float(run) if run else None
    except ValueError:
        return None


def peak_of_files(files: list[str], held: pa.Table | None = None) -> Peak | None:
    """The peak over results files (damaged ones left out: they are reported elsewhere) and the
    results ``held`` in memory (a full disk)."""
    from replayer.record.folder import open_file

    fold = PeakFold()
    for f in files:
        pf = open_file(f)
        if pf is None or not {"sent_ns", "end_ns"} <= set(pf.schema_arrow.names):
            continue
        run = (pf.schema_arrow.metadata or {}).get(b"replayer.t0_wall_s", b"")
        try:
            fold.add(pf.read(columns=["sent_ns", "end_ns"]), run)
        except (OSError, pa.ArrowException):
            continue
    if held is not None and held.num_rows:
        fold.add(held, (held.schema.metadata or {}).get(b"replayer.t0_wall_s", b""))
    return fold.peak()
