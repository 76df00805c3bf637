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
for ``rolling.CLOSE_RETRY_S``; ``unwritten_rows`` is what could not be written in the end, and
``unwritten_table`` those results (the run's summary counts them: a full disk loses no measurement
from the summary, only from the folder; ``--resume`` sends them again, the checkpoint being behind
them). A final roll that fails leaves the parts, readable (``roll_error``).

A ``checkpoint.json`` written after every flush records the replay position (see ``--resume``).
Every whole file (parts, rolled files, checkpoint, ``write_json``) is written to a temporary
file in the same folder, fsynced and renamed over its name (``atomic_file``): a kill leaves the
old file or the new one, never a part of one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import glob
import logging
import os
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq

import replayer.record.retention as retention
from replayer.core.result import SCHEMA, RequestResult, Rows, batches_to_table, to_table
from replayer.record.folder import (  # the folder's readers, re-exported here (their old home)
    next_part_seq,
    open_file as open_file,
    part_files,
    read_file as read_file,
    read_results as read_results,
    remove_rolled_parts,
    report_damaged as report_damaged,
    result_files as result_files,
    rolled_files as rolled_files,
)
from replayer.record.rolling import PARTS, ROLL_GROUP_ROWS, ROLLED_PARTS, RollingWriter, atomic_file, write_json

log = logging.getLogger(__name__)

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
    ``retain_bytes`` / ``retain_age_s``: retention's bounds (``retention.apply``); ``digest``: what
    retention keeps of each file it removes (``retention.Digest``), needed with a bound.
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
        digest: retention.Digest | None = None,
    ) -> None:
        self.dir = results_dir
        self.parts_dir = os.path.join(results_dir, PARTS)
        os.makedirs(self.parts_dir, exist_ok=True)
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self._checkpoint = checkpoint
        self._buf = Rows(itl_format=itl_format)  # converted to Arrow on the loop, in small batches (see Rows)
        if (retain_bytes is not None or retain_age_s is not None) and digest is None:
            raise ValueError("a retention bound needs the digest of the files it removes (digest=)")
        self.retain_bytes = retain_bytes
        self.retain_age_s = retain_age_s
        self._digest = digest
        retention.remove_leftovers(results_dir)
        remove_rolled_parts(results_dir)
        schema = SCHEMA.with_metadata({k.encode(): v.encode() for k, v in (metadata or {}).items()})
        self._w = RollingWriter(
            results_dir,
            schema,
            rolled_path=self._rolled_path,
            empty_final=lambda: not result_files(self.dir),
            first_part=next_part_seq(results_dir),
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

    @property
    def roll_error(self) -> str | None:
        """Why the final roll failed (the parts stay, readable), else None."""
        return self._w.roll_error

    def unwritten_table(self) -> pa.Table | None:
        """The results that could not be written (after ``close``: for good), with the file
        metadata (run anchor, config); None when every result is on disk."""
        return self._w.kept_table()

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
            if self._digest is not None and retention.apply(  # (no digest: no bound either)
                self.dir,
                digest=self._digest,
                max_bytes=self.retain_bytes,
                max_age_s=self.retain_age_s,
                headroom=self._headroom() if self.retain_bytes is not None else 0,
            ):
                release_memory()  # (each removed file was read whole to fold it)
        except (OSError, ValueError, pa.ArrowException) as e:
            log.error("retention in %s failed: %s (nothing is removed until it works)", self.dir, e)
        self.results_bytes = retention.folder_bytes(self.dir)
        files = rolled_files(self.dir)[:1] or part_files(self.dir)[:1]
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
