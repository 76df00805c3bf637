"""Retention of a long run's results: the oldest rolled files go, the run's summary stays whole.

A soak writes results for days; ``--retain-size`` (total bytes of the results folder) and
``--retain-age`` (seconds) bound what stays on disk. After each flush the recorder calls
``apply``: while the folder is larger than the size bound, or the oldest rolled file's newest
result is older than the age bound, the oldest rolled file (``requests-NNNNN.parquet``, oldest =
lowest number) is removed. Parts not yet rolled (the file being written) and the newest rolled
file are never removed.

Before a file goes, its results are folded by the ``Digest`` the run passes in (the results
stage's ``removed.digest_file``: counts, token totals, error kinds, each latency's
count/sum/min/max/variance and DDSketch) and merged into ``removed.json``, with the file's
name, the run windows it covered (``runwindows.run_windows``: the run's duration) and
the (loop, row) pairs it recorded (as row ranges per loop: ``--resume`` skips them). The file
is removed only after ``removed.json`` is renamed into place (``rolling.write_json``: a kill
leaves the old digest or the new one), and readers leave out every file that ``removed.json``
names (``folder.result_files``), so a kill between the two shows no result twice; the next
recorder in the folder removes such a file (``remove_leftovers``). The summary of a folder
(``summary.fold_files``) merges ``removed.json``: counts equal those before the removal;
percentiles of the removed results come from their sketches (within ``stats.RELATIVE_ACCURACY``);
means, minima and maxima stay exact. Each removal is logged (the file, its rows and bytes, why).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable

import numpy as np

from replayer.record.folder import (  # re-exported: the removed files' digest is read there
    REMOVED as REMOVED,
    ROLLED_PARTS,
    Removed as Removed,
    open_file,
    part_seq as part_seq,
    read_removed as read_removed,
    results_dir_of as results_dir_of,
    rolled_files,
    samples_kept_since as samples_kept_since,
)
from replayer.record.rolling import write_json
from replayer.record.runwindows import run_windows

#: What retention keeps of a results file it removes: ``digest(path, fold_json)`` folds the file's
#: results into ``fold_json`` (the digest so far, None for the first) and returns the new digest
#: (JSON), or None when the file holds no results to keep (damaged). The summary's fold is the
#: results stage's (``replayer.results.removed.digest_file``); the run passes it in.
Digest = Callable[[str, "dict | None"], "dict | None"]

log = logging.getLogger(__name__)

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "B": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "KI": 2**10,
    "MI": 2**20,
    "GI": 2**30,
    "TI": 2**40,
}


def parse_bytes(text: str | int) -> int:
    """Bytes from ``2GB``, ``500MB``, ``1.5GiB``, ``100000`` (decimal units K/M/G/T = 1000^n,
    binary Ki/Mi/Gi/Ti = 1024^n; the trailing B is optional). Raises ValueError naming the text."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size: give bytes with an optional unit, e.g. 2GB, 500MB, 1.5GiB")
    unit = (m.group(2) or "").upper().rstrip("B")
    return int(float(m.group(1)) * _UNITS[unit])


def folder_bytes(results_dir: str) -> int:
    """Bytes of every file under ``results_dir`` (a file removed meanwhile counts 0)."""
    total = 0
    for dirpath, _dirs, files in os.walk(results_dir):
        for f in files:
            try:
                total += os.stat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


# -- the digest ----------------------------------------------------------------------------------
def _ranges(rows: np.ndarray) -> list[list[int]]:
    """Sorted unique ``rows`` as inclusive ``[first, last]`` runs of consecutive numbers."""
    if not rows.size:
        return []
    rows = np.unique(rows)
    breaks = np.flatnonzero(np.diff(rows) != 1)
    starts = np.concatenate(([rows[0]], rows[breaks + 1]))
    ends = np.concatenate((rows[breaks], [rows[-1]]))
    return [[int(a), int(b)] for a, b in zip(starts, ends)]


def _merge_ranges(a: list[list[int]], b: list[list[int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for lo, hi in sorted(a + b):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


# -- removal -------------------------------------------------------------------------------------
def _file_info(path: str) -> tuple[int, float | None, dict, dict[str, list[list[int]]], list[str]]:
    """(rows, newest end as Unix s or None, run windows (warm-up rows left out: the summary's
    duration), recorded row ranges per loop, parts it holds) of a rolled file."""
    import pyarrow.compute as pc

    pf = open_file(path)
    if pf is None:
        return 0, None, {}, {}, []
    meta = pf.schema_arrow.metadata or {}
    windows = {
        k.decode() if isinstance(k, bytes) else k: list(v) for k, v in run_windows([path], removed=False).items()
    }
    wall = meta.get(b"replayer.t0_wall_s")
    newest = None
    if wall is not None and windows:
        newest = float(wall) + max(v[1] for v in windows.values()) / 1e9
    no_warmup = run_windows([path], removed=False, skip_warmup=True)
    windows = {k.decode() if isinstance(k, bytes) else k: list(v) for k, v in no_warmup.items()}
    t = pf.read(columns=["loop", "row", "outcome"])
    sent = t.filter(pc.not_equal(t.column("outcome"), "not_started"))
    loops, rows = sent.column("loop").to_numpy(), sent.column("row").to_numpy()
    recorded = {str(int(lp)): _ranges(rows[loops == lp]) for lp in np.unique(loops)}
    parts = json.loads(meta[ROLLED_PARTS]) if meta.get(ROLLED_PARTS) else []
    return pf.metadata.num_rows, newest, windows, recorded, parts


def newest_end_s(path: str) -> float | None:
    """The Unix time of the last result of a results file (its run anchor plus its largest
    ``end_ns``), None when unknown."""
    pf = open_file(path)
    wall = (pf.schema_arrow.metadata or {}).get(b"replayer.t0_wall_s") if pf is not None else None
    windows = run_windows([path], removed=False) if wall is not None else {}
    return float(wall) + max(b for _, b in windows.values()) / 1e9 if windows and wall is not None else None


def oldest_start_s(path: str) -> float | None:
    """The Unix time of the first request sent in a results file, None when unknown."""
    pf = open_file(path)
    wall = (pf.schema_arrow.metadata or {}).get(b"replayer.t0_wall_s") if pf is not None else None
    windows = run_windows([path], removed=False) if wall is not None else {}
    return float(wall) + min(a for a, _ in windows.values()) / 1e9 if windows and wall is not None else None


def remove(results_dir: str, path: str, why: str, digest: Digest) -> None:
    """Fold the rolled file ``path`` into the folder's ``removed.json`` (``digest``), then delete
    it (logged)."""
    removed = read_removed(results_dir) or Removed()
    fold_json = digest(path, removed.fold_json)
    size = os.path.getsize(path)
    if fold_json is not None:  # (a damaged file has no results to keep: it was left out of every summary)
        rows, newest, windows, recorded, parts = _file_info(path)
        removed.fold_json = fold_json
        removed.rows += rows
        for run, (lo, hi) in windows.items():
            a, b = removed.run_windows.get(run, (lo, hi))
            removed.run_windows[run] = [min(a, lo), max(b, hi)]
        for lp, rs in recorded.items():
            removed.recorded[lp] = _merge_ranges(removed.recorded.get(lp, []), rs)
        removed.parts_max = max([removed.parts_max] + [part_seq(n) for n in parts])
        if newest is not None:
            removed.newest_end_s = max(removed.newest_end_s or newest, newest)
    else:
        rows = 0
    removed.files.append(os.path.basename(path))
    removed.bytes += size
    write_json(os.path.join(results_dir, REMOVED), removed.to_json(), indent=None)
    os.remove(path)
    log.info(
        "retention: removed %s (%d results, %d bytes): %s; its counts and statistics are kept in %s",
        path,
        rows,
        size,
        why,
        REMOVED,
    )


def remove_leftovers(results_dir: str) -> int:
    """Delete the files ``removed.json`` names that are still there (a removal cut short
    between the digest and the deletion: readers already leave them out); returns how many."""
    removed = read_removed(results_dir)
    n = 0
    for name in removed.files if removed else ():
        try:
            os.remove(os.path.join(results_dir, name))
            n += 1
        except FileNotFoundError:
            pass
    return n


def apply(
    results_dir: str,
    *,
    digest: Digest,
    max_bytes: int | None = None,
    max_age_s: float | None = None,
    now: float | None = None,
    newest_end=newest_end_s,
    headroom: int = 0,
) -> list[str]:
    """Remove the oldest rolled files of ``results_dir`` while the folder holds more than
    ``max_bytes`` less ``headroom`` (the bytes the writer will add before the next call: the
    folder stays within ``max_bytes`` between calls too) or the oldest rolled file's newest
    result is older than ``max_age_s`` (``now``: Unix s). Parts (results not yet rolled) and the newest rolled file are never removed (every
    reader finds the folder's ``removed.json`` through a results file in it). ``digest``: what is
    kept of each file removed (``Digest``). Returns the files removed."""
    if max_bytes is None and max_age_s is None:
        return []
    now = time.time() if now is None else now
    gone: list[str] = []
    size = folder_bytes(results_dir) if max_bytes is not None else 0
    for f in rolled_files(results_dir)[:-1]:  # (the newest stays: a folder always has a results file)
        why = None
        if max_bytes is not None and size + headroom > max_bytes:
            why = (
                f"the results folder holds {size} bytes, and {size + headroom} with room for the next flush "
                f"and roll: more than --retain-size {max_bytes}"
            )
        elif max_age_s is not None:
            end = newest_end(f)
            if end is not None and now - end > max_age_s:
                why = f"its newest result is {now - end:.0f} s old, older than --retain-age {max_age_s:g} s"
        if why is None:
            break
        try:
            fsize = os.path.getsize(f)
        except OSError:
            continue
        remove(results_dir, f, why, digest)
        size -= fsize
        gone.append(f)
    return gone
