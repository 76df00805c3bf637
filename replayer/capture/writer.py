"""Captured rows to Parquet as requests finish: parts flushed often, rolled into trace files.

The same crash-safety rules as the results recorder (``replayer.recorder``): every
``flush_rows`` rows or ``flush_interval_s`` seconds the rows so far become a complete Parquet
part ``OUT/parts/part-NNNNNNNN.parquet`` (written to a temporary file, fsynced, renamed: a
SIGKILL loses at most one flush interval); parts are rolled into ``OUT/trace-NNNNN.parquet``
every ``roll_rows`` rows / ``roll_interval_s`` seconds and at the end. A rolled file lists the
parts it holds in its metadata (``replayer.rolled_parts``), so a kill between its rename and
the removal of its parts never shows a row twice: the trace reader skips the parts a rolled
file lists. The last roll (a clean stop) sorts its rows by arrival.

Every file carries the capture's metadata (``replayer.capture``, block size, time unit ns, the
wall-clock start), so ``replayer trace inspect`` and ``replayer run`` read the folder as a trace.
"""

from __future__ import annotations

import concurrent.futures
import glob
import json
import os
import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..recorder import ROLLED_PARTS, atomic_file
from ..trace.model import CAPTURE_META as CAPTURE_KEY
from .rows import SCHEMA

PARTS = "parts"


def _write_table(table: pa.Table, path: str) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    with atomic_file(path) as f:
        f.write(sink.getvalue())


class CaptureWriter:
    """Writes captured rows (dicts with ``rows.SCHEMA``'s keys) under ``out``.

    ``add`` is called on the event loop; the Arrow conversion and the file writes happen on one
    writer thread, so the loop that forwards streams never waits for a disk."""

    def __init__(self, out: str, metadata: dict[str, str], *, flush_rows: int = 1000,
                 flush_interval_s: float = 2.0, roll_rows: int | None = None,
                 roll_interval_s: float | None = None) -> None:
        self.dir = out
        self.parts_dir = os.path.join(out, PARTS)
        os.makedirs(self.parts_dir, exist_ok=True)
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.roll_rows = roll_rows
        self.roll_interval_s = roll_interval_s
        self._meta = {k.encode(): v.encode() for k, v in {CAPTURE_KEY: "1", **metadata}.items()}
        self._buf: list[dict] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="capture-writer")
        self._lock = threading.Lock()
        self._seq = 1 + max((int(os.path.basename(p)[5:13]) for p in glob.glob(os.path.join(self.parts_dir, "part-*.parquet"))),
                            default=-1)
        self._parts: list[str] = []
        self._part_rows = 0
        self._last_roll = time.monotonic()
        self._last_flush = time.monotonic()
        self.rows_written = 0
        self._closed = False

    def add(self, row: dict) -> None:
        self._buf.append(row)
        if len(self._buf) >= self.flush_rows:
            self.flush()

    def flush(self) -> concurrent.futures.Future | None:
        """Hand the buffered rows to the writer thread (returns its future, None when empty)."""
        self._last_flush = time.monotonic()
        if self._closed or not self._buf:
            return None
        rows, self._buf = self._buf, []
        return self._pool.submit(self._write, rows)

    def flush_if_due(self) -> None:
        if time.monotonic() - self._last_flush >= self.flush_interval_s:
            self.flush()

    def _write(self, rows: list[dict]) -> None:
        table = pa.Table.from_pylist(rows, schema=SCHEMA.with_metadata(self._meta))
        with self._lock:
            path = os.path.join(self.parts_dir, f"part-{self._seq:08d}.parquet")
            self._seq += 1
            _write_table(table, path)
            self._parts.append(path)
            self._part_rows += table.num_rows
            self.rows_written += table.num_rows
            due = (self.roll_rows is not None and self._part_rows >= self.roll_rows) or (
                self.roll_interval_s is not None and time.monotonic() - self._last_roll >= self.roll_interval_s)
            if due:
                self._roll(final=False)

    def _roll(self, *, final: bool) -> None:
        """Merge the parts into the next ``trace-NNNNN.parquet`` (caller holds the lock); the
        final roll sorts by timestamp. An empty capture writes an empty final file (readable)."""
        self._last_roll = time.monotonic()
        n = len(glob.glob(os.path.join(self.dir, "trace-*.parquet")))
        if not self._parts and not (final and n == 0):
            return
        tables = [pq.read_table(p) for p in self._parts]
        table = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
        if final:
            table = table.take(pc.sort_indices(table, sort_keys=[("timestamp", "ascending")]))
        names = [os.path.basename(p) for p in self._parts]
        meta = {**self._meta, ROLLED_PARTS: json.dumps(names).encode()}
        _write_table(table.replace_schema_metadata(meta), os.path.join(self.dir, f"trace-{n:05d}.parquet"))
        for p in self._parts:
            os.remove(p)
        self._parts = []
        self._part_rows = 0

    def close(self) -> None:
        """Write what is buffered and roll the parts into the last trace file. Idempotent."""
        if self._closed:
            return
        fut = self.flush()
        if fut is not None:
            fut.result()
        self._closed = True
        self._pool.shutdown(wait=True)
        with self._lock:
            self._roll(final=True)
        try:
            os.rmdir(self.parts_dir)
        except OSError:
            pass

