"""When the runs that wrote a results folder sent: per run (keyed by its anchor), the first send
and the last end, from the Parquet column statistics, the removed files' digests included. The
summary's ``duration`` adds these windows up (a resumed run has a time axis of its own)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replayer.core.result import without_warmup
from replayer.record.folder import open_file, read_removed, results_dir_of


def removed_of(files: list[str]) -> list:
    """The ``retention.Removed`` digests of the results folders ``files`` are in."""
    dirs = sorted({results_dir_of(f) for f in files})
    return [r for r in (read_removed(d) for d in dirs) if r is not None]


def run_durations(files: list[str], tables: Sequence[pa.Table] = ()) -> list[float]:
    """Seconds from the first request sent to the last one ended, per run that wrote ``files``
    (and ``tables``: results held in memory, keyed by their schema's metadata as a file is),
    warm-up requests left out (``run_windows(skip_warmup=True)``)."""
    windows = run_windows(files, skip_warmup=True)
    for t in tables:
        t = without_warmup(t)
        run = (t.schema.metadata or {}).get(b"replayer.t0_wall_s", b"")
        lo, hi = pc.min(t.column("sent_ns")).as_py(), pc.max(t.column("end_ns")).as_py()
        if lo is None or hi is None:
            continue
        a, b = windows.get(run, (lo, hi))
        windows[run] = (min(a, lo), max(b, hi))
    return [(b - a) / 1e9 for a, b in windows.values()]


def run_windows(files: list[str], *, removed: bool = True, skip_warmup: bool = False) -> dict[bytes, tuple[int, int]]:
    """(first sent_ns, last end_ns) per run that wrote ``files``, keyed by the run anchor in each
    file's metadata (``replayer.t0_wall_s``, b"" if none): a resumed run's times are offsets
    from its own anchor. From the Parquet column statistics where present. ``removed``: also the
    windows of the files retention removed from the folders of ``files`` (``removed.json``).
    ``skip_warmup``: without the warm-up requests (``warmup`` true): the span the summary's
    throughputs divide by (a file holding warm-up rows is read for it)."""
    windows: dict[bytes, tuple[int, int]] = {}
    for digest in removed_of(files) if removed else ():  # (the runs' windows in files retention removed)
        for run, (lo, hi) in digest.run_windows.items():
            key = run.encode()
            a, b = windows.get(key, (lo, hi))
            windows[key] = (min(a, lo), max(b, hi))
    for f in files:
        pf = open_file(f)
        if pf is None:  # damaged (reported): its rows are not counted either
            continue
        run = (pf.schema_arrow.metadata or {}).get(b"replayer.t0_wall_s", b"")
        try:
            if skip_warmup and _has_warmup(pf):
                lo, hi = _min_max_without_warmup(pf)
            else:
                lo, hi = _min_max(pf, "sent_ns", min), _min_max(pf, "end_ns", max)
        except (OSError, pa.ArrowException):
            continue
        if lo is None or hi is None:
            continue
        a, b = windows.get(run, (lo, hi))
        windows[run] = (min(a, lo), max(b, hi))
    return windows


def _min_max(pf: pq.ParquetFile, column: str, pick) -> int | None:
    """``pick`` (min or max) of a column's non-null values: from row-group statistics, or by
    reading the column where a row group has none."""
    md = pf.metadata
    idx = next(i for i in range(md.num_columns) if md.schema.column(i).path == column)
    vals = []
    for g in range(md.num_row_groups):
        st = md.row_group(g).column(idx).statistics
        if st is not None and st.has_min_max:
            vals.append(st.min if pick is min else st.max)
        elif st is None or st.null_count != md.row_group(g).num_rows:  # unknown: read it
            col = pf.read_row_group(g, columns=[column]).column(0)
            v = (pc.min if pick is min else pc.max)(col).as_py()
            if v is not None:
                vals.append(v)
    return pick(vals) if vals else None


def _has_warmup(pf: pq.ParquetFile) -> bool:
    """Whether a results file may hold warm-up rows (its ``warmup`` column is true somewhere)."""
    if "warmup" not in pf.schema_arrow.names:
        return False
    return bool(_min_max(pf, "warmup", max))


def _min_max_without_warmup(pf: pq.ParquetFile) -> tuple[int | None, int | None]:
    """(first sent_ns, last end_ns) of the rows that are not warm-up, read from the columns."""
    t = pf.read(columns=["sent_ns", "end_ns", "warmup"])
    keep = pc.invert(pc.fill_null(t.column("warmup"), False))
    return pc.min(t.column("sent_ns").filter(keep)).as_py(), pc.max(t.column("end_ns").filter(keep)).as_py()
