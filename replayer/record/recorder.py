"""Stream per-request results to Parquet as the run goes, so that nothing measured is lost.

Every ``flush_rows`` results or ``flush_interval_s`` seconds the buffered results are written by
one background thread as a small, complete Parquet file ``RESULTS/parts/part-NNNNNNNN.parquet``
(written to a temporary name, then renamed: a part on disk is always readable). A SIGKILL loses
at most one flush interval. Parts are merged ("rolled") into ``RESULTS/requests.parquet`` at the
end of a run; with ``roll_rows``/``roll_interval_s`` they are also rolled during the run into
``requests-NNNNN.parquet`` files, so a week-long soak is many bounded files, not one growing one.
``read_results(RESULTS)`` reads all of them as one table. The part and roll protocol is
``replayer.record.rolling``'s (the capture proxy's trace writer uses the same one).

A roll is atomic for readers: a rolled file names the parts it holds in its metadata
(``replayer.rolled_parts``), and ``result_files`` leaves those parts out, so a kill between the
rename of the rolled file and the removal of its parts never shows a row twice (the next writer
in the folder removes such leftovers). A damaged file (cut short, not Parquet) is reported by
name and left out; every intact file is still read (``open_file``, ``read_file``).

A write that fails (no file descriptor left, disk full, an I/O error) loses nothing: its results
stay in memory, the error is logged when it starts and when writing works again, and the next
flush writes them first (the checkpoint is not moved past results not on disk). ``close`` retries
for ``rolling.CLOSE_RETRY_S``; ``unwritten_rows`` is what could not be written in the end.

A ``checkpoint.json`` written after every flush records the replay position (see ``--resume``).
Every whole file (parts, rolled files, checkpoint, ``write_json``) is written to a temporary
file in the same folder, fsynced and renamed over its name (``atomic_file``): a kill leaves the
old file or the new one, never a part of one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import glob
import json
import logging
import os
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import replayer.record.retention as retention
from replayer.core.result import SCHEMA, RequestResult, Rows, batches_to_table, to_table
from replayer.record.rolling import PARTS, ROLL_GROUP_ROWS, ROLLED_PARTS, RollingWriter, atomic_file, write_json
from replayer.record.rolling import atomic_write_table as _atomic_write_table

log = logging.getLogger(__name__)

READ_BUFFER_BYTES = 1 << 20  # results files are read through a buffered stream of this size
__all__ = [
    "PARTS",
    "ROLLED_PARTS",
    "ROLL_GROUP_ROWS",
    "Recorder",
    "atomic_file",
    "write_json",
    "read_results",
    "result_files",
    "rolled_files",
    "open_file",
    "read_file",
    "report_damaged",
]


def _roll_step(step: str) -> None:
    """Called after each step of a roll ("written", "renamed", "removed N"): a seam where a test
    kills the process to check that readers see each row once whatever step was last."""


class Recorder:
    """Writes results under ``results_dir`` (schema ``result.SCHEMA``) through one
    ``rolling.RollingWriter``: parts, rolls into ``requests.parquet`` / ``requests-NNNNN.parquet``.

    ``metadata``: file-level key/values (run anchor, config) stored in every file.
    ``checkpoint``: called on the loop thread at each flush; its dict goes to checkpoint.json.
    Not thread-safe: call ``add``/``flush`` from the event loop thread only.
    """

    def __init__(
        self,
        results_dir: str,
        *,
        flush_rows: int = 2000,
        flush_interval_s: float = 2.0,
        roll_rows: int | None = None,
        roll_interval_s: float | None = None,
        metadata: dict[str, str] | None = None,
        checkpoint: Callable[[], dict] | None = None,
        itl_format: str = "exact",
        retain_bytes: int | None = None,
        retain_age_s: float | None = None,
    ) -> None:
        self.dir = results_dir
        self.parts_dir = os.path.join(results_dir, PARTS)
        os.makedirs(self.parts_dir, exist_ok=True)
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self._checkpoint = checkpoint
        self._buf = Rows(itl_format=itl_format)  # converted to Arrow on the loop, in small batches (see Rows)
        self.retain_bytes = retain_bytes
        self.retain_age_s = retain_age_s
        retention.remove_leftovers(results_dir)
        remove_rolled_parts(results_dir)
        schema = SCHEMA.with_metadata({k.encode(): v.encode() for k, v in (metadata or {}).items()})
        self._w = RollingWriter(
            results_dir,
            schema,
            rolled_path=self._rolled_path,
            empty_final=lambda: not result_files(self.dir),
            first_part=_next_part_seq(results_dir),
            roll_rows=roll_rows,
            roll_interval_s=roll_interval_s,
            group_rows=ROLL_GROUP_ROWS,
            thread_name="recorder",
            on_step=lambda s: _roll_step(s),
            after_roll=lambda: release_memory(),
        )
        self.results_bytes: int | None = None  # the folder's size and its oldest result (Unix s),
        self.oldest_timestamp_s: float | None = None  # as of the last flush (``/status``, metrics)
        self._oldest_cache: dict[str, float | None] = {}
        self.rows_added = 0
        self._last_part_bytes = 0  # the size of the last part written (retention's headroom)

    @property
    def rows_written(self) -> int:
        return self._w.rows_written

    @property
    def unwritten_rows(self) -> int:
        """Results a failed write keeps in memory (/status, the end of the run)."""
        return self._w.unwritten_rows

    @property
    def write_errors(self) -> int:
        return self._w.write_errors

    def add(self, res: RequestResult) -> None:
        """Buffer one result (~10-20 us with a few hundred ITL samples, plus ~1 ms per 128
        results when their Arrow batch is built); hands a full buffer to the writer thread."""
        self._buf.add(res)
        self.rows_added += 1
        if self._buf.n >= self.flush_rows:
            self.flush()

    def flush(self) -> concurrent.futures.Future | None:
        """Hand the buffered results (and a checkpoint) to the writer thread; returns its future."""
        if self._w.closed:
            return None
        batches = self._buf.take()
        ckpt = self._checkpoint() if self._checkpoint else None
        if not batches and ckpt is None:
            return None
        return self._w.submit(lambda: self._write(batches, ckpt))

    def _write(self, batches: list[pa.RecordBatch], ckpt: dict | None) -> None:
        """On the writer thread, its lock held: a part (with the results an earlier failed write
        kept), the checkpoint, a roll when due, retention. A failed part write keeps the results
        for the next flush and skips the checkpoint; a failed roll is tried again at the next."""
        if not self._w.write_or_keep(batches_to_table(batches) if batches else None, "results"):
            return
        try:
            if ckpt is not None:
                write_json(os.path.join(self.dir, "checkpoint.json"), ckpt, indent=None)
            self._w.roll_if_due()
        except (OSError, pa.ArrowException) as e:
            log.error("results in %s: checkpoint or roll failed (%s); tried again at the next flush", self.dir, e)
        self._retain()

    def _retain(self) -> None:
        """Apply the retention bounds (``retention.apply``), then note the folder's size and
        oldest result (caller holds the lock). A failure is logged; the run goes on."""
        try:
            if retention.apply(
                self.dir,
                max_bytes=self.retain_bytes,
                max_age_s=self.retain_age_s,
                headroom=self._headroom() if self.retain_bytes is not None else 0,
            ):
                release_memory()  # (each removed file was read whole to fold it)
        except (OSError, ValueError, pa.ArrowException) as e:
            log.error("retention in %s failed: %s (nothing is removed until it works)", self.dir, e)
        self.results_bytes = retention.folder_bytes(self.dir)
        files = rolled_files(self.dir)[:1] or _part_files(self.dir)[:1]
        self._oldest_cache = {
            f: self._oldest_cache[f] if f in self._oldest_cache else retention.oldest_start_s(f) for f in files
        }
        self.oldest_timestamp_s = self._oldest_cache[files[0]] if files else None

    def _headroom(self) -> int:
        """What the folder takes beyond its size now before the next retention (lock held): the
        next part (as large as the last one) and the roll's copy of the parts not yet rolled
        (written before they are removed), so ``--retain-size`` holds between flushes too."""
        sizes = []
        for p in self._w.parts:
            try:
                sizes.append(os.path.getsize(p))
            except OSError:
                pass
        if sizes:
            self._last_part_bytes = sizes[-1]
        return sum(sizes) + self._last_part_bytes

    def _rolled_path(self, final: bool) -> str:
        """``requests.parquet`` for a run's only file (a final roll in a folder with no rolled
        file and nothing removed), else the next ``requests-NNNNN.parquet`` (numbers never reused:
        retention may have removed the oldest files). A final roll with no results in the whole
        folder writes an empty ``requests.parquet`` (an empty shard: mergeable, its metadata says
        which shard)."""
        removed = retention.read_removed(self.dir)
        if final and not glob.glob(os.path.join(self.dir, "requests*.parquet")) and removed is None:
            return os.path.join(self.dir, "requests.parquet")
        names = [os.path.basename(f) for f in glob.glob(os.path.join(self.dir, "requests-*.parquet"))]
        names += removed.files if removed else []
        n = 1 + max((int(m[9:14]) for m in names if m[9:14].isdigit()), default=-1)
        return os.path.join(self.dir, f"requests-{n:05d}.parquet")

    async def run_periodic_flush(self) -> None:
        """Flush every ``flush_interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.flush_interval_s)
            fut = self.flush()
            if fut is not None:
                fut.add_done_callback(_log_failure)

    def close(self) -> None:
        """Write what is buffered, roll the parts into the final file. Blocking; idempotent.
        (An empty parts/ is removed; target-metric parts there go first.)"""
        if self._w.closed:
            return
        self.flush()
        self._w.close(then=self._retain, what="results")


def _log_failure(fut: concurrent.futures.Future) -> None:
    """Log a flush job that raised (what ``_write`` does not handle itself), so none fails unseen."""
    if not fut.cancelled() and fut.exception() is not None:
        log.error("writing results failed", exc_info=fut.exception())


def release_memory() -> None:
    """Give the memory Arrow freed in this thread back to the system. A roll reads tens of MB of
    parts and writes them again; pyarrow's default pool (mimalloc) keeps what this thread freed
    for reuse, and over a soak's rolls the process grew (~9 MB per 100k results with 300 ITL
    samples each, rolled every 20k results; flat with this call after each roll). Call it on the
    thread that did the work: mimalloc's heaps are per thread."""
    pa.default_memory_pool().release_unused()


def warm_up() -> None:
    """Build and encode one results table off the clock: pyarrow's first conversion takes ~0.5 s
    (lazy initialisation) and holds the GIL, which would stall the event loop mid-replay."""
    import io

    pq.write_table(to_table([RequestResult(row=0, itl_ms=[1.0])]), io.BytesIO(), compression="zstd")


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
    return rolled + [p for p in _part_files(results_dir) if os.path.basename(p) not in covered]


def rolled_files(results_dir: str) -> list[str]:
    """The rolled results files of a folder, oldest first (``requests.parquet``, the file of a run
    that ended without rolling, before the numbered ones a resumed run rolls), without those
    ``removed.json`` names (see ``result_files``)."""
    removed = retention.read_removed(results_dir)
    gone = set(removed.files) if removed else set()
    files = [f for f in glob.glob(os.path.join(results_dir, "requests*.parquet")) if os.path.basename(f) not in gone]
    return sorted(files, key=lambda f: (os.path.basename(f) != "requests.parquet", os.path.basename(f)))


def _part_files(results_dir: str) -> list[str]:
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


def _next_part_seq(results_dir: str) -> int:
    """The next part number of a folder: above every part in ``parts/`` and every part a rolled
    file lists (a rolled file's list must never name a later run's part)."""
    removed = retention.read_removed(results_dir)
    names = [os.path.basename(p) for p in _part_files(results_dir)] + list(_rolled_parts(rolled_files(results_dir)))
    seqs = [retention.part_seq(n) for n in names] + [removed.parts_max if removed else -1]
    return 1 + max(seqs)


def remove_rolled_parts(results_dir: str) -> int:
    """Remove the parts a rolled file already holds (left by a roll cut short); returns how many."""
    covered = _rolled_parts(rolled_files(results_dir))
    gone = [p for p in _part_files(results_dir) if os.path.basename(p) in covered]
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
            _atomic_write_table(kept, f, buffered=False)
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
