"""Stream per-request results to ``RESULTS/requests.parquet`` as the run goes.

Results are buffered and written as Parquet row groups by one background thread (pyarrow releases
the GIL while encoding and writing), every ``flush_rows`` results or ``flush_interval_s`` seconds,
whichever comes first; a crash loses at most that much. ``close`` writes the rest and the footer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading

import pyarrow as pa
import pyarrow.parquet as pq

from .result import SCHEMA, RequestResult, to_table

log = logging.getLogger(__name__)


class Recorder:
    """Writes results to ``path`` (Parquet, schema ``result.SCHEMA``, one row group per flush).

    ``metadata``: file-level key/values (run anchor, config); written in the footer.
    Not thread-safe: call ``add``/``flush`` from the event loop thread only.
    """

    def __init__(self, path: str, *, flush_rows: int = 2000, flush_interval_s: float = 2.0,
                 metadata: dict[str, str] | None = None) -> None:
        self.path = path
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        schema = SCHEMA.with_metadata({k.encode(): v.encode() for k, v in (metadata or {}).items()})
        self._writer = pq.ParquetWriter(path, schema, compression="zstd")
        self._buf: list[RequestResult] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="recorder")
        self._lock = threading.Lock()
        self.rows_written = 0
        self.rows_added = 0
        self._closed = False

    def add(self, res: RequestResult) -> None:
        """Buffer one result (cheap); hands a full buffer to the writer thread."""
        self._buf.append(res)
        self.rows_added += 1
        if len(self._buf) >= self.flush_rows:
            self.flush()

    def flush(self) -> concurrent.futures.Future | None:
        """Hand the buffered results to the writer thread; returns its future (None if empty)."""
        if not self._buf or self._closed:
            return None
        batch, self._buf = self._buf, []
        return self._pool.submit(self._write, batch)

    def _write(self, batch: list[RequestResult]) -> None:
        table = to_table(batch)
        with self._lock:
            self._writer.write_table(table, row_group_size=max(len(batch), 1))
            self.rows_written += len(batch)

    async def run_periodic_flush(self) -> None:
        """Flush every ``flush_interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.flush_interval_s)
            self.flush()

    def close(self) -> None:
        """Write what is buffered, then the file footer. Blocking; idempotent."""
        if self._closed:
            return
        fut = self.flush()
        if fut is not None:
            fut.result()
        self._pool.shutdown(wait=True)
        with self._lock:
            self._writer.close()
        self._closed = True


def read_results(path: str) -> pa.Table:
    """Read a results file (or a folder of parts) back as an Arrow table."""
    return pq.read_table(path)
