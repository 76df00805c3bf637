"""The fidelity and drift verdicts of results folders (``summary.json``'s ``fidelity`` and
``drift``), read from the files themselves: so they cover a resumed run's earlier files and the
shards of ``replayer merge`` (every file's times put on the axis of the earliest run anchor, as
the merge does), and the results files retention removed, from their digest (``removed.json``):
their drift windows (``driftdigest``) and their fidelity figures (``fidelitydigest``). With a
digest in any folder of a merge, each folder's inter-arrivals are its own sends' (a digest's
gaps are of its folder's sends; the verdict says so); without, those of all the folders' sends.

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

from replayer.record.folder import open_file, read_removed, report_damaged, result_files
from replayer.results.drift import judge_drift
from replayer.results.driftdigest import digest_origins, seed_windows, usable
from replayer.results.driftwindows import COLUMNS as DRIFT_COLUMNS, DriftFold, loop_origins
from replayer.results.fidelity import COLUMNS as FIDELITY_COLUMNS, FidelityBounds, FidelityFold, judge_fidelity
from replayer.results.fidelitydigest import seed_fidelity

log = logging.getLogger(__name__)

_TIME_COLUMNS = ("due_ns", "sent_ns", "first_token_ns", "last_token_ns", "end_ns")


def _anchored(d: str) -> list[tuple[str, float | None]]:
    """(results file, its run's wall-clock anchor in Unix s or None) of every readable file of
    the folder ``d``."""
    out = []
    for f in result_files(d):
        pf = open_file(f)
        if pf is None:
            continue
        wall = (pf.schema_arrow.metadata or {}).get(b"replayer.t0_wall_s")
        out.append((f, float(wall) if wall else None))
    return out


def _ns(s: float) -> int:
    """Unix s as Unix ns, rounded as every anchor is (so shifts between anchors are exact)."""
    return round(s * 1e9)


def _batches(
    files: list[tuple[str, float | None]], columns: tuple[str, ...], base: float | None = None
) -> Iterator[pa.RecordBatch]:
    """Batches of ``columns`` of ``files``, times shifted to the axis of ``base`` (Unix s; None:
    the earliest anchor among them)."""
    walls = [w for _, w in files if w is not None]
    if base is None:
        base = min(walls) if walls else None
    for f, wall in files:
        shift = _ns(wall) - _ns(base) if wall is not None and base is not None else 0
        pf = open_file(f)
        if pf is None:
            continue
        try:
            names = set(pf.schema_arrow.names)  # (the schema is built anew at each access)
            for b in pf.iter_batches(batch_size=65_536, columns=[c for c in columns if c in names]):
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


def _fidelity_fold(
    per_dir: list[list[tuple[str, float | None]]], digests: list[dict | None], bound_ms: float
) -> FidelityFold:
    """The fidelity figures of the folders' files and of their removed files' digests: one
    sequence of sends over every folder without a digest, each folder's own with one."""
    files = [f for fs in per_dir for f in fs]
    if not any(digests):
        fold = FidelityFold()
        for b in _batches(files, FIDELITY_COLUMNS):
            fold.add(b, lag_bound_ms=bound_ms)
        return fold
    walls = [w for _, w in files if w is not None]
    base = min(walls) if walls else 0.0
    folds = []
    for fs, digest in zip(per_dir, digests):
        f = FidelityFold()
        if digest:
            seed_fidelity(f, digest, _ns(base))
        for b in _batches(fs, FIDELITY_COLUMNS, base):
            f.add(b, lag_bound_ms=bound_ms)
        folds.append(f)
    for f in folds[1:]:
        folds[0].merge(f)
    if len(folds) > 1 and folds[0].removed is not None:
        folds[0].removed["per_folder"] = True
    return folds[0]


def _drift_fold(
    removed_folds: list[dict], files: list[tuple[str, float | None]], window_s: float
) -> tuple[DriftFold, float | None]:
    """The drift windows of the files and of the removed files' digests (``removed_folds``: each
    folder's ``removed.json`` fold), on the axis of the earliest anchor among the files kept and
    the removed loops' origins; and that base (Unix s)."""
    kept = [r.get("drift") for r in removed_folds]
    digests = usable([k for k in kept if k], window_s)
    removed = digest_origins(digests)
    walls = [w for _, w in files if w is not None] + [o / 1e9 for o in removed.values()]
    base = min(walls) if walls else None
    base_ns = round(base * 1e9) if base is not None else 0
    origins = loop_origins(_batches(files, ("loop", "due_ns"), base))
    for lp, o in removed.items():
        origins[lp] = min(origins.get(lp, o - base_ns), o - base_ns)
    fold = DriftFold(window_s, origins)
    for d in digests:
        seed_windows(fold, d)
    for b in _batches(files, DRIFT_COLUMNS, base):
        fold.add(b)
    return fold, base


def verdict_sections(
    dirs: list[str],
    summary: dict[str, Any],
    *,
    bounds: FidelityBounds | None = None,
    max_concurrency: int | None = None,
    window_s: float = 300.0,
    min_change_pct: float = 10.0,
    reference: str = "first",
) -> dict[str, Any]:
    """``{"fidelity": ..., "drift": ...}`` of the results folders ``dirs`` (one run, or the shards
    of a merge); ``summary``: their summary so far (``stopped_early``, ``target_switches``);
    ``reference``: ``--drift-reference``."""
    bounds = bounds or FidelityBounds()
    per_dir = [_anchored(d) for d in dirs]
    files = [f for fs in per_dir for f in fs]
    removed = [(r.fold_json or {}) if r is not None else {} for r in (read_removed(d) for d in dirs)]
    fold = _fidelity_fold(per_dir, [r.get("fidelity") for r in removed], bounds.max_lag_ms)
    switches = summary.get("target_switches") if isinstance(summary.get("target"), list) else None
    fidelity = judge_fidelity(
        fold.figures(),
        bounds,
        max_concurrency=max_concurrency,
        stopped_early=bool(summary.get("stopped_early") or summary.get("stop_signal")),
        target_switches=switches,
    )
    fidelity["trace_rows_in_window"] = summary.get("scheduled")
    older = [d for d, r in zip(dirs, removed) if r and not r.get("fidelity")]
    if older:  # (a digest written before it kept them: said, not hidden)
        fidelity.setdefault("notes", []).append(
            f"the results files retention removed from {', '.join(older)} kept no fidelity figures "
            "(an older replayer's digest): the fidelity verdict is of the files kept"
        )
    drift_fold, base = _drift_fold(removed, files, window_s)
    try:
        samples = _samples_on_axis(dirs, base)
    except (OSError, pa.ArrowException) as e:  # (the verdict goes on without the target's signals)
        log.warning("drift: the target's samples cannot be read: %s", e)
        samples = None
    if samples is not None:
        drift_fold.add_samples(samples)
    drift = judge_drift(
        drift_fold.series(),
        window_s=window_s,
        min_change_pct=min_change_pct,
        max_lag_ms=bounds.max_lag_ms,
        reference=reference,
    )
    return {"fidelity": fidelity, "drift": drift}


__all__ = ["verdict_sections"]
