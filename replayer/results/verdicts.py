"""The fidelity and drift verdicts of results folders (``summary.json``'s ``fidelity`` and
``drift``), read from the files themselves: so they cover a resumed run's earlier files and the
shards of ``replayer merge`` (every file's times put on the axis of the earliest run anchor, as
the merge does), but not results files retention removed (their windows are gone: the drift
series starts at the oldest file kept).

``verdict_sections`` reads the folders' results files three times, a few columns each (loop
origins, the fidelity figures, the drift windows), one batch in memory at a time, and the
target's samples once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replayer.record.folder import open_file, report_damaged, result_files
from replayer.results.drift import COLUMNS as DRIFT_COLUMNS, DriftFold, judge_drift, loop_origins
from replayer.results.fidelity import COLUMNS as FIDELITY_COLUMNS, FidelityBounds, FidelityFold, judge_fidelity

log = logging.getLogger(__name__)

_TIME_COLUMNS = ("due_ns", "sent_ns", "first_token_ns", "last_token_ns", "end_ns")


def _anchored(dirs: list[str]) -> list[tuple[str, float | None]]:
    """(results file, its run's wall-clock anchor in Unix s or None) of every readable file."""
    out = []
    for d in dirs:
        for f in result_files(d):
            pf = open_file(f)
            if pf is None:
                continue
            wall = (pf.schema_arrow.metadata or {}).get(b"replayer.t0_wall_s")
            out.append((f, float(wall) if wall else None))
    return out


def _batches(files: list[tuple[str, float | None]], columns: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    """Batches of ``columns`` of ``files``, times shifted to the earliest anchor among them."""
    walls = [w for _, w in files if w is not None]
    base = min(walls) if walls else None
    for f, wall in files:
        shift = round((wall - base) * 1e9) if wall is not None and base is not None else 0
        pf = open_file(f)
        if pf is None:
            continue
        try:
            for b in pf.iter_batches(batch_size=65_536, columns=[c for c in columns if c in pf.schema_arrow.names]):
                if shift:
                    b = pa.RecordBatch.from_arrays(
                        [
                            pc.add(c, pa.scalar(shift, pa.int64())) if n in _TIME_COLUMNS else c
                            for n, c in zip(b.schema.names, b.columns)
                        ],
                        schema=b.schema,
                    )
                yield b
        except (OSError, pa.ArrowException) as e:
            report_damaged(f, e)


def _samples_on_axis(dirs: list[str], base: float | None) -> pa.Table | None:
    """The folders' target-metric samples with ``t_ns`` on the results' axis (from ``time_s``)."""
    from replayer.observe.target_samples import read_samples

    tables = [t for t in (read_samples(d) for d in dirs) if t is not None and t.num_rows]
    if not tables or base is None:
        return None
    t = pa.concat_tables(tables, promote_options="default")
    t_ns = ((t.column("time_s").to_numpy(zero_copy_only=False) - base) * 1e9).astype(np.int64)
    return t.set_column(t.schema.get_field_index("t_ns"), "t_ns", pa.array(t_ns))


def verdict_sections(
    dirs: list[str],
    summary: dict[str, Any],
    *,
    bounds: FidelityBounds | None = None,
    max_concurrency: int | None = None,
    window_s: float = 300.0,
    min_change_pct: float = 10.0,
) -> dict[str, Any]:
    """``{"fidelity": ..., "drift": ...}`` of the results folders ``dirs`` (one run, or the shards
    of a merge); ``summary``: their summary so far (``stopped_early``, ``target_switches``)."""
    bounds = bounds or FidelityBounds()
    files = _anchored(dirs)
    fold = FidelityFold()
    for b in _batches(files, FIDELITY_COLUMNS):
        fold.add(b, lag_bound_ms=bounds.max_lag_ms)
    switches = summary.get("target_switches") if isinstance(summary.get("target"), list) else None
    fidelity = judge_fidelity(
        fold.figures(),
        bounds,
        max_concurrency=max_concurrency,
        stopped_early=bool(summary.get("stopped_early") or summary.get("stop_signal")),
        target_switches=switches,
    )
    fidelity["trace_rows_in_window"] = summary.get("scheduled")
    drift_fold = DriftFold(window_s, loop_origins(_batches(files, ("loop", "due_ns"))))
    for b in _batches(files, DRIFT_COLUMNS):
        drift_fold.add(b)
    walls = [w for _, w in files if w is not None]
    try:
        samples = _samples_on_axis(dirs, min(walls) if walls else None)
    except (OSError, pa.ArrowException) as e:  # (the verdict goes on without the target's signals)
        log.warning("drift: the target's samples cannot be read: %s", e)
        samples = None
    if samples is not None:
        drift_fold.add_samples(samples)
    drift = judge_drift(
        drift_fold.series(), window_s=window_s, min_change_pct=min_change_pct, max_lag_ms=bounds.max_lag_ms
    )
    return {"fidelity": fidelity, "drift": drift}


__all__ = ["verdict_sections"]
