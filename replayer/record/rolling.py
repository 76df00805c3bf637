"""Crash-safe Parquet output written as a process runs: whole files replaced atomically, rows
flushed as small parts by one writer thread, parts rolled into bigger files.

One protocol, used by the results recorder (``replayer.record.recorder``) and the capture proxy's trace
writer (``replayer.capture.writer``), each with its own schema and file names:

* every whole file is written to ``NAME.tmp`` in the same folder, fsynced and renamed over its
  name, the folder fsynced (``atomic_file``): a kill leaves the old file or the new one;
* a flush writes the rows so far as a complete part ``parts/part-NNNNNNNN.parquet`` (a SIGKILL
  loses at most one flush interval);
* a roll merges the parts into one rolled file whose metadata lists them (``ROLLED_PARTS``), then
  removes them: from the rolled file's rename on, readers skip the parts it lists, so a kill
  between the rename and the removals never shows a row twice. Rolls happen every ``roll_rows``
  rows / ``roll_interval_s`` seconds and at the end; a rolled file is written part by part in row
  groups of ``group_rows`` (bounded memory), except a final roll sorted by a column.

The event loop never waits for a disk: ``submit`` runs a job on the writer thread. A part write
that fails (no file descriptor left, disk full, an I/O error) loses nothing (``write_or_keep``):
its rows stay in memory, the error is logged when it starts and when writing works again, and the
next write puts them first. At the end (``close``) such rows are tried again for a while; what
is still unwritten then stays readable in memory (``kept_table``) for the run's summary, and a
final roll that fails (a full disk) leaves the parts as they are (readable; the next writer in
the folder rolls them): ``close`` never raises for a failed write.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

PARTS = "parts"
#: a rolled file's metadata key: JSON list of the part file names (``part-NNNNNNNN.parquet``) it holds
ROLLED_PARTS = b"replayer.rolled_parts"
ROLL_GROUP_ROWS = 50_000  # rows per row group of a rolled file
CLOSE_RETRY_S = 30.0  # at the end, rows whose write failed are tried again for this long
#: exit code of a process (``run``, ``record``) whose rows or summary could not all be written
#: (a full disk, an I/O error): it says what is not on disk, and ends as any other run does
EXIT_WRITE_FAILED = 5


@contextlib.contextmanager
def atomic_file(path: str):
    """Yield a binary file that replaces ``path`` when the block ends: written as ``path.tmp``
    in the same folder, flushed and fsynced, renamed over ``path``, the folder fsynced. On an
    exception the temporary file is removed and ``path`` is left as it was."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path) or ".")


def _fsync_dir(path: str) -> None:
    """Make a rename in folder ``path`` durable (best effort: not every file system allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path: str, obj: object, *, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON to ``path`` through ``atomic_file`` (encoded first: a value that
    cannot be encoded leaves the old file untouched)."""
    data = json.dumps(obj, indent=indent).encode()
    with atomic_file(path) as f:
        f.write(data)


def atomic_write_table(table: pa.Table, path: str, *, buffered: bool = True) -> None:
    """Write ``table`` to ``path`` (zstd Parquet) through ``atomic_file``.

    ``buffered``: encode into an Arrow memory buffer, then write it with one Python file write.
    Handing ``pq.write_table`` the path instead holds the GIL through the file writes, which
    stalls the event loop for tens of milliseconds per flush at hundreds of rows per second.
    False: stream through a Python file object instead of holding the whole file in memory."""
    if buffered:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        data = sink.getvalue()
        with atomic_file(path) as f:
            f.write(data)
    else:
        with atomic_file(path) as f:
            pq.write_table(table, f, compression="zstd")


def _no_step(step: str) -> None:
    pass


class RollingWriter:
    """Parts and rolls of one output folder (see the module docstring).

    ``schema``: every part's and rolled file's schema and file metadata. ``rolled_path(final)``
    names the next rolled file; ``empty_final()`` says whether a final roll with no parts still
    writes a (readable, empty) file. ``first_part``: the first part number (above every part a
    folder's files already name). ``sort_final_by``: a column the final roll sorts by.
    ``on_step``: called after each step of a roll ("written", "renamed", "removed N"), a seam
    where a test kills the process. ``after_roll``: called on the writer thread after a roll
    (e.g. to give memory back). Jobs (``submit``) run one at a time on the writer thread with
    ``lock`` held and call ``write_part`` / ``roll_if_due``."""

    def __init__(
        self,
        folder: str,
        schema: pa.Schema,
        *,
        rolled_path: Callable[[bool], str],
        empty_final: Callable[[], bool],
        first_part: int = 0,
        roll_rows: int | None = None,
        roll_interval_s: float | None = None,
        sort_final_by: str | None = None,
        group_rows: int = ROLL_GROUP_ROWS,
        thread_name: str = "rolling-writer",
        on_step: Callable[[str], None] = _no_step,
        after_roll: Callable[[], None] | None = None,
    ) -> None:
        self.dir = folder
        self.parts_dir = os.path.join(folder, PARTS)
        os.makedirs(self.parts_dir, exist_ok=True)
        self.schema = schema
        self.roll_rows = roll_rows
        self.roll_interval_s = roll_interval_s
        self._rolled_path = rolled_path
        self._empty_final = empty_final
        self._sort_final_by = sort_final_by
        self._group_rows = group_rows
        self._on_step = on_step
        self._after_roll = after_roll
        self.lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=thread_name)
        self._seq = first_part
        self._parts: list[str] = []  # written and not yet rolled
        self._part_rows = 0
        self._last_roll = time.monotonic()
        self.rows_written = 0
        self.closed = False
        self._kept: list[pa.Table] = []  # rows a failed part write kept (``write_or_keep``)
        self.unwritten_rows = 0  # their count
        self.write_errors = 0  # part writes that failed
        self.roll_error: str | None = None  # why the final roll failed (None: it did not)

    @property
    def parts(self) -> list[str]:
        """The parts written and not yet rolled, oldest first."""
        return self._parts

    def submit(self, job: Callable[[], None]) -> concurrent.futures.Future | None:
        """Run ``job`` on the writer thread with ``lock`` held (None once closed)."""
        if self.closed:
            return None

        def locked() -> None:
            with self.lock:
                job()

        return self._pool.submit(locked)

    def kept_table(self) -> pa.Table | None:
        """The rows a failed write keeps in memory, as one table with the file metadata (None
        when there are none): after ``close``, what could not be written in the end."""
        with self.lock:
            if not self._kept:
                return None
            table = self._kept[0] if len(self._kept) == 1 else pa.concat_tables(self._kept)
        return table.replace_schema_metadata(self.schema.metadata)

    def write_part(self, table: pa.Table) -> None:
        """Write ``table`` as the next part (in a job: lock held)."""
        path = os.path.join(self.parts_dir, f"part-{self._seq:08d}.parquet")
        self._seq += 1
        atomic_write_table(table.replace_schema_metadata(self.schema.metadata), path)
        self._parts.append(path)
        self._part_rows += table.num_rows
        self.rows_written += table.num_rows

    def write_or_keep(self, table: pa.Table | None, what: str) -> bool:
        """Write the rows an earlier failed write kept and ``table`` as the next part (in a job:
        lock held). When the write fails they all stay in memory for the next call, logged (as
        ``what``, e.g. "results") when it starts, every 100th failure, and when it works again.
        True when nothing is left unwritten."""
        if table is not None and table.num_rows:
            self._kept.append(table)
        if not self._kept:
            return True
        rows = sum(t.num_rows for t in self._kept)
        try:
            self.write_part(self._kept[0] if len(self._kept) == 1 else pa.concat_tables(self._kept))
        except (OSError, pa.ArrowException) as e:
            self.write_errors += 1
            if not self.unwritten_rows:
                log.error(
                    "cannot write %s in %s: %s; they are kept in memory and written when it works again (%d so far)",
                    what,
                    self.dir,
                    e,
                    rows,
                )
            elif self.write_errors % 100 == 0:
                log.error("still cannot write %s in %s: %s (%d kept in memory)", what, self.dir, e, rows)
            self.unwritten_rows = rows
            return False
        if self.unwritten_rows:
            log.warning("writing %s in %s works again: the %d kept in memory are on disk", what, self.dir, rows)
        self._kept.clear()
        self.unwritten_rows = 0
        return True

    def roll_if_due(self) -> None:
        """Roll when ``roll_rows`` rows or ``roll_interval_s`` seconds have gathered (lock held)."""
        if (self.roll_rows is not None and self._part_rows >= self.roll_rows) or (
            self.roll_interval_s is not None and time.monotonic() - self._last_roll >= self.roll_interval_s
        ):
            self.roll(final=False)

    def roll(self, *, final: bool) -> None:
        """Merge the parts into one rolled file, then remove them (lock held)."""
        self._last_roll = time.monotonic()
        if not self._parts and not (final and self._empty_final()):
            return
        dst = self._rolled_path(final)
        names = [os.path.basename(p) for p in self._parts]
        schema = self.schema.with_metadata({**(self.schema.metadata or {}), ROLLED_PARTS: json.dumps(names).encode()})
        with atomic_file(dst) as f:
            with pq.ParquetWriter(f, schema, compression="zstd") as w:
                if final and self._sort_final_by is not None:
                    tables = [pq.read_table(p) for p in self._parts]
                    if tables:
                        table = pa.concat_tables(tables)
                        w.write_table(
                            table.take(pc.sort_indices(table, sort_keys=[(self._sort_final_by, "ascending")])),
                            row_group_size=self._group_rows,
                        )
                else:  # part by part, in row groups of ~group_rows: bounded memory however many parts
                    group: list[pa.Table] = []
                    rows = 0
                    for p in self._parts:
                        t = pq.read_table(p)
                        group.append(t)
                        rows += t.num_rows
                        if rows >= self._group_rows:
                            w.write_table(pa.concat_tables(group))
                            group, rows = [], 0
                    if group:
                        w.write_table(pa.concat_tables(group))
            self._on_step("written")
        self._on_step("renamed")
        for i, p in enumerate(self._parts):
            os.remove(p)
            self._on_step(f"removed {i + 1}")
        self._parts = []
        self._part_rows = 0
        if self._after_roll is not None:
            self._after_roll()

    def close(
        self, then: Callable[[], None] | None = None, *, what: str = "rows", retry_s: float | None = None
    ) -> None:
        """Wait for the submitted jobs; write what a failed write kept, trying again each second
        for ``retry_s`` (default ``CLOSE_RETRY_S``; what is still unwritten then is logged, as
        ``what``, and stays in ``kept_table``); roll the parts into the last file (a failure is
        logged and kept in ``roll_error``: the parts stay, readable), run ``then`` (lock held),
        remove the empty parts folder. Blocking; idempotent; never raises for a failed write."""
        if self.closed:
            return
        self.closed = True
        self._pool.shutdown(wait=True)
        deadline = time.monotonic() + (CLOSE_RETRY_S if retry_s is None else retry_s)
        with self.lock:
            while self.unwritten_rows and time.monotonic() < deadline:
                time.sleep(1.0)
                self.write_or_keep(None, what)
            if self.unwritten_rows:
                log.error(
                    "%d %s could not be written in %s: they are not on disk (held in memory until the process ends)",
                    self.unwritten_rows,
                    what,
                    self.dir,
                )
            try:
                self.roll(final=True)
            except (OSError, pa.ArrowException) as e:
                self.roll_error = str(e)
                log.error(
                    "cannot roll the %s of %s into their last file (%s): its %d parts stay as they are, readable",
                    what,
                    self.dir,
                    e,
                    len(self._parts),
                )
            if then is not None:
                then()
        try:
            os.rmdir(self.parts_dir)
        except OSError:
            pass
