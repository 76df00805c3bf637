"""Captured rows to Parquet as requests finish: parts flushed often, rolled into trace files.

The crash-safe part and roll protocol is ``replayer.record.rolling``'s (the results recorder's too):
every ``flush_rows`` rows or ``flush_interval_s`` seconds the rows so far become a complete
Parquet part ``OUT/parts/part-NNNNNNNN.parquet`` (a SIGKILL loses at most one flush interval);
parts are rolled into ``OUT/trace-NNNNN.parquet`` every ``roll_rows`` rows / ``roll_interval_s``
seconds and at the end. A rolled file lists the parts it holds (``replayer.rolled_parts``), so the
trace reader never shows a row twice. The last roll (a clean stop) sorts its rows by arrival.
A write that fails (no file descriptor left, disk full) keeps its rows in memory for the next
flush, with the error logged when it starts and when writing works again: no row is dropped unseen.

Every file carries the capture's metadata (``replayer.capture``, block size, time unit ns, the
wall-clock start), so ``replayer trace inspect`` and ``replayer run`` read the folder as a trace.
"""

from __future__ import annotations

import concurrent.futures
import glob
import logging
import os
import time

import pyarrow as pa

from replayer.capture.rows import SCHEMA
from replayer.record.rolling import PARTS, RollingWriter
from replayer.trace.model import CAPTURE_META as CAPTURE_KEY

log = logging.getLogger(__name__)


class CaptureWriter:
    """Writes captured rows (dicts with ``rows.SCHEMA``'s keys) under ``out``.

    ``add`` is called on the event loop; the Arrow conversion and the file writes happen on the
    rolling writer's thread, so the loop that forwards streams never waits for a disk."""

    def __init__(
        self,
        out: str,
        metadata: dict[str, str],
        *,
        flush_rows: int = 1000,
        flush_interval_s: float = 2.0,
        roll_rows: int | None = None,
        roll_interval_s: float | None = None,
    ) -> None:
        self.dir = out
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        schema = SCHEMA.with_metadata({k.encode(): v.encode() for k, v in {CAPTURE_KEY: "1", **metadata}.items()})
        parts = glob.glob(os.path.join(out, PARTS, "part-*.parquet"))
        self._w = RollingWriter(
            out,
            schema,
            rolled_path=self._rolled_path,
            empty_final=lambda: not self._rolled(),
            first_part=1 + max((int(os.path.basename(p)[5:13]) for p in parts), default=-1),
            roll_rows=roll_rows,
            roll_interval_s=roll_interval_s,
            sort_final_by="timestamp",
            thread_name="capture-writer",
        )
        self._buf: list[dict] = []
        self._last_flush = time.monotonic()

    @property
    def rows_written(self) -> int:
        return self._w.rows_written

    def add(self, row: dict) -> None:
        self._buf.append(row)
        if len(self._buf) >= self.flush_rows:
            self.flush()

    def flush(self) -> concurrent.futures.Future | None:
        """Hand the buffered rows to the writer thread (returns its future, None when empty)."""
        self._last_flush = time.monotonic()
        if self._w.closed or not (self._buf or self._w.unwritten_rows):
            return None
        rows, self._buf = self._buf, []
        return self._w.submit(lambda: self._write(rows))

    def flush_if_due(self) -> None:
        if time.monotonic() - self._last_flush >= self.flush_interval_s:
            self.flush()

    def _write(self, rows: list[dict]) -> None:
        if not self._w.write_or_keep(
            pa.Table.from_pylist(rows, schema=self._w.schema) if rows else None, "captured rows"
        ):
            return
        try:
            self._w.roll_if_due()
        except (OSError, pa.ArrowException) as e:
            log.error("rolling captured rows in %s failed: %s (tried again at the next flush)", self.dir, e)

    def _rolled(self) -> list[str]:
        return glob.glob(os.path.join(self.dir, "trace-*.parquet"))

    def _rolled_path(self, final: bool) -> str:
        return os.path.join(self.dir, f"trace-{len(self._rolled()):05d}.parquet")

    @property
    def unwritten_rows(self) -> int:
        """Rows a failed write keeps in memory (after ``close``: lost with the process)."""
        return self._w.unwritten_rows

    @property
    def roll_error(self) -> str | None:
        """Why the last roll failed (its parts stay, readable as the trace), else None."""
        return self._w.roll_error

    def close(self) -> None:
        """Write what is buffered and roll the parts into the last trace file (sorted by arrival).
        Idempotent; a write that fails for good is logged, never raised (``unwritten_rows``,
        ``roll_error``)."""
        if self._w.closed:
            return
        self.flush()
        self._w.close(what="captured rows")
