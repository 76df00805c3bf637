"""The results folder's readers: which files a folder holds (rolled files, parts, what
retention removed), reading them (a damaged file named and left out), and a new folder's name.
Nothing here writes results; the writer is ``replayer.record.recorder``, the removal
``replayer.record.retention``."""

from __future__ import annotations

import glob
import json
import logging
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replayer.core.result import SCHEMA
from replayer.record.rolling import PARTS, ROLLED_PARTS, atomic_write_table

log = logging.getLogger(__name__)

READ_BUFFER_BYTES = 1 << 20  # results files are read through a buffered stream of this size
#: the digest of the results files retention removed, in the results folder
REMOVED = "removed.json"


def part_seq(name: str) -> int:
    """The number of a part file's name (``part-NNNNNNNN.parquet``), -1 for another name."""
    digits = name[5:13]
    return int(digits) if name.startswith("part-") and digits.isdigit() else -1


class Removed:
    """The digest of the results files removed from a folder (``removed.json``)."""

    def __init__(self, d: dict | None = None) -> None:
        d = d or {}
        self.files: list[str] = list(d.get("files", []))
        self.rows = int(d.get("rows", 0))
        self.bytes = int(d.get("bytes", 0))
        self.fold_json: dict | None = d.get("fold")
        # run anchor -> [first sent, last end] ns ("spans" in folders written before the name changed)
        self.run_windows: dict[str, list[int]] = dict(d.get("run_windows", d.get("spans", {})))
        self.recorded: dict[str, list[list[int]]] = dict(d.get("recorded", {}))  # loop -> row ranges sent
        # the highest part number the removed files held (part numbers are never reused); folders
        # written before kept every part's name ("parts"), one more per flush for the whole run
        self.parts_max: int = max([int(d.get("parts_max", -1))] + [part_seq(n) for n in d.get("parts", [])])
        self.newest_end_s: float | None = d.get("newest_end_s")

    def to_json(self) -> dict:
        return {
            "files": self.files,
            "rows": self.rows,
            "bytes": self.bytes,
            "fold": self.fold_json,
            "run_windows": self.run_windows,
            "recorded": self.recorded,
            "parts_max": self.parts_max,
            "newest_end_s": self.newest_end_s,
        }

    def recorded_rows(self) -> dict[int, np.ndarray]:
        """loop -> the rows the removed files recorded as sent (any outcome but not started)."""
        return {
            int(lp): np.concatenate([np.arange(a, b + 1) for a, b in rs]) if rs else np.zeros(0, np.int64)
            for lp, rs in self.recorded.items()
        }


def read_removed(results_dir: str) -> Removed | None:
    """The folder's ``removed.json`` (None when retention removed nothing there, or when it
    cannot be read: reported by name)."""
    path = os.path.join(results_dir, REMOVED)
    try:
        with open(path, encoding="utf-8") as f:
            return Removed(json.load(f))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("%s: cannot read the digest of removed results files (%s): their results are left out", path, e)
        return None


def samples_kept_since(results_dir: str, oldest_s: float | None) -> float | None:
    """Where the target-metric samples kept start (``target_samples.SampleFiles.keep_since``):
    ``oldest_s`` (the oldest result kept) once retention has removed results, else None (all kept)."""
    return oldest_s if os.path.exists(os.path.join(results_dir, REMOVED)) else None


def results_dir_of(path: str) -> str:
    """The results folder a results file is in (a part's folder is ``parts/`` inside it)."""
    d = os.path.dirname(os.path.abspath(path))
    return os.path.dirname(d) if os.path.basename(d) == "parts" else d


def new_results_dir(base: str = "results") -> str:
    """Create and return a new ``base/<YYYYmmdd-HHMMSS>`` folder; ``-2``, ``-3``... when one of
    that second exists already (two runs started together, e.g. shards on one host). The
    creation itself is the claim (``os.mkdir`` fails if another process made it first).
    Raises OSError when it cannot be created."""
    os.makedirs(base, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for k in range(1, 1000):
        path = os.path.join(base, stamp if k == 1 else f"{stamp}-{k}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{base}/{stamp}-*: 999 folders of this second exist")


def earlier_run(results_dir: str, *, resume: str | None = None) -> str | None:
    """Why a new run must not write into ``results_dir`` (it holds an earlier run's results or
    checkpoint: the two would be summarized as one), or None. ``--resume`` continues a run there
    on purpose: the message names ``--resume RESUME`` (default ``results_dir``; a ``--workers``
    run resumes its top folder, not a worker's)."""
    files = result_files(results_dir)
    if files or os.path.exists(os.path.join(results_dir, "checkpoint.json")):
        return (
            f"holds an earlier run's results ({len(files)} results file(s)); --resume {resume or results_dir} "
            "continues that run, another --results starts a new one"
        )
    return None


def result_files(results_dir: str) -> list[str]:
    """Every results file of a results folder: rolled files, oldest first, then parts not yet
    rolled (a part that a readable rolled file lists is left out: a roll was cut short before
    removing it; so is a rolled file that retention's ``removed.json`` names: a removal cut
    short before deleting it, its results are in the digest)."""
    rolled = rolled_files(results_dir)
    covered = _rolled_parts(rolled)
    return rolled + [p for p in part_files(results_dir) if os.path.basename(p) not in covered]


def rolled_files(results_dir: str) -> list[str]:
    """The rolled results files of a folder, oldest first (``requests.parquet``, the file of a run
    that ended without rolling, before the numbered ones a resumed run rolls), without those
    ``removed.json`` names (see ``result_files``)."""
    removed = read_removed(results_dir)
    gone = set(removed.files) if removed else set()
    files = [f for f in glob.glob(os.path.join(results_dir, "requests*.parquet")) if os.path.basename(f) not in gone]
    return sorted(files, key=lambda f: (os.path.basename(f) != "requests.parquet", os.path.basename(f)))


def part_files(results_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(results_dir, PARTS, "part-*.parquet")))


def _rolled_parts(rolled: list[str]) -> set[str]:
    """Names of the parts the readable files of ``rolled`` hold (their ``ROLLED_PARTS``)."""
    covered: set[str] = set()
    for f in rolled:
        pf = open_file(f)
        names = (pf.schema_arrow.metadata or {}).get(ROLLED_PARTS) if pf is not None else None
        if names:
            covered.update(json.loads(names))
    return covered


def next_part_seq(results_dir: str) -> int:
    """The next part number of a folder: above every part in ``parts/`` and every part a rolled
    file lists (a rolled file's list must never name a later run's part)."""
    removed = read_removed(results_dir)
    names = [os.path.basename(p) for p in part_files(results_dir)] + list(_rolled_parts(rolled_files(results_dir)))
    seqs = [part_seq(n) for n in names] + [removed.parts_max if removed else -1]
    return 1 + max(seqs)


def remove_rolled_parts(results_dir: str) -> int:
    """Remove the parts a rolled file already holds (left by a roll cut short); returns how many."""
    covered = _rolled_parts(rolled_files(results_dir))
    gone = [p for p in part_files(results_dir) if os.path.basename(p) in covered]
    for p in gone:
        os.remove(p)
    return len(gone)


_reported: set[str] = set()


def report_damaged(path: str, err: Exception) -> None:
    """Report a damaged results file once per process, by name, with what is lost."""
    if path in _reported:
        return
    _reported.add(path)
    try:
        size = f"{os.path.getsize(path)} bytes"
    except OSError:
        size = "size unknown"
    log.warning(
        "%s: damaged results file (%s, %s): its results are left out; every other file is read",
        path,
        str(err).splitlines()[0] if str(err) else type(err).__name__,
        size,
    )


def open_file(path: str) -> pq.ParquetFile | None:
    """The Parquet file at ``path``, or None when it cannot be opened (cut short, not Parquet:
    reported once by name, see ``report_damaged``). Read through a 1 MiB buffered stream, page by
    page: unbuffered, pyarrow reads a whole column chunk at once (a rolled file's 50k-row group of
    ITL lists is ~70 MB), and a summary of a 250k-row folder peaked at 364 MB instead of 210 MB
    just reading its batches."""
    try:
        return pq.ParquetFile(path, buffer_size=READ_BUFFER_BYTES, pre_buffer=False)
    except (OSError, pa.ArrowException) as e:
        report_damaged(path, e)
        return None


def read_file(path: str, columns: list[str] | None = None) -> pa.Table | None:
    """One results file as a table (its metadata kept), or None when it is damaged (reported)."""
    pf = open_file(path)
    if pf is None:
        return None
    try:
        return pf.read(columns=columns)
    except (OSError, pa.ArrowException) as e:
        report_damaged(path, e)
        return None


def drop_not_started(results_dir: str) -> int:
    """Remove the ``not_started`` records (rows a stopped run never sent) from the results files
    of ``results_dir``: a resumed run sends those rows and records them anew, and the folder must
    hold each row once. Each file holding such records is rewritten through a temporary file and
    a rename (removed if nothing else is in it). Parts a rolled file already holds go first (a
    removed rolled file must not bring them back). Damaged files are left as they are. Returns
    the number of records removed."""
    remove_rolled_parts(results_dir)
    removed = 0
    for f in result_files(results_dir):
        outcome = read_file(f, columns=["outcome"])
        if outcome is None:
            continue
        n = pc.sum(pc.equal(outcome.column("outcome"), "not_started")).as_py() or 0
        if not n:
            continue
        table = read_file(f)
        if table is None:
            continue
        kept = table.filter(pc.invert(pc.equal(table.column("outcome"), "not_started")))
        if kept.num_rows:
            atomic_write_table(kept, f, buffered=False)
        else:
            os.remove(f)
        removed += n
    return removed


def read_results(path: str, columns: list[str] | None = None) -> pa.Table:
    """All results of a results folder (or one file) as one Arrow table (schema ``SCHEMA``, or
    only ``columns`` of it: reading a long soak's results whole takes a lot of memory). A
    damaged file is reported by name and left out."""
    files = [path] if os.path.isfile(path) else result_files(path)
    tables = [t.replace_schema_metadata(None) for t in (read_file(f, columns) for f in files) if t is not None]
    if not tables:
        empty = SCHEMA.empty_table()
        return empty.select(columns) if columns else empty
    return pa.concat_tables(tables, promote_options="default")  # (files written before itl_counts existed)
