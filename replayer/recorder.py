"""Stream per-request results to Parquet as the run goes, so that nothing measured is lost.

Every ``flush_rows`` results or ``flush_interval_s`` seconds the buffered results are written by
one background thread as a small, complete Parquet file ``RESULTS/parts/part-NNNNNNNN.parquet``
(written to a temporary name, then renamed: a part on disk is always readable). A SIGKILL loses
at most one flush interval. Parts are merged ("rolled") into ``RESULTS/requests.parquet`` at the
end of a run; with ``roll_rows``/``roll_interval_s`` they are also rolled during the run into
``requests-NNNNN.parquet`` files, so a week-long soak is many bounded files, not one growing one.
``read_results(RESULTS)`` reads all of them as one table.

A ``checkpoint.json`` written after every flush records the replay position (see ``--resume``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import glob
import json
import logging
import os
import threading
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .result import SCHEMA, RequestResult, Rows, batches_to_table, to_table

log = logging.getLogger(__name__)

PARTS = "parts"
ROLL_GROUP_ROWS = 50_000  # rows per row group of a rolled file


def _atomic_write_table(table: pa.Table, path: str, *, buffered: bool = True) -> None:
    """Write ``table`` to ``path`` (zstd Parquet) through a temporary file and a rename.

    ``buffered``: encode into an Arrow memory buffer, then write it with one Python file write.
    Handing ``pq.write_table`` the path instead stalled the event loop (and then the writes
    it hands to the launcher) for 20-40 ms per flush at 470 requests/s (issue 7's stress slice at 160x: dispatch error p99
    13-40 ms with it, ~1 ms buffered). False: stream through a Python file object instead of
    holding the whole file in memory."""
    tmp = path + ".tmp"
    if buffered:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        data = sink.getvalue()
        with open(tmp, "wb") as f:
            f.write(data)
    else:
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression="zstd")
    os.replace(tmp, path)


class Recorder:
    """Writes results under ``results_dir`` (schema ``result.SCHEMA``).

    ``metadata``: file-level key/values (run anchor, config) stored in every file.
    ``checkpoint``: called on the loop thread at each flush; its dict goes to checkpoint.json.
    Not thread-safe: call ``add``/``flush`` from the event loop thread only.
    """

    def __init__(self, results_dir: str, *, flush_rows: int = 2000, flush_interval_s: float = 2.0,
                 roll_rows: int | None = None, roll_interval_s: float | None = None,
                 metadata: dict[str, str] | None = None,
                 checkpoint: Callable[[], dict] | None = None) -> None:
        self.dir = results_dir
        self.parts_dir = os.path.join(results_dir, PARTS)
        os.makedirs(self.parts_dir, exist_ok=True)
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.roll_rows = roll_rows
        self.roll_interval_s = roll_interval_s
        self._schema = SCHEMA.with_metadata({k.encode(): v.encode() for k, v in (metadata or {}).items()})
        self._checkpoint = checkpoint
        self._buf = Rows()  # converted to Arrow on the loop, in small batches (see Rows)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="recorder")
        self._lock = threading.Lock()
        self._seq = len(glob.glob(os.path.join(self.parts_dir, "part-*.parquet")))
        self._parts: list[str] = []          # parts of this run not yet rolled
        self._part_rows = 0
        self._last_roll = time.monotonic()
        self.rows_written = 0
        self.rows_added = 0
        self._closed = False

    def add(self, res: RequestResult) -> None:
        """Buffer one result (~10-20 us with a few hundred ITL samples, plus ~1 ms per 128
        results when their Arrow batch is built); hands a full buffer to the writer thread."""
        self._buf.add(res)
        self.rows_added += 1
        if self._buf.n >= self.flush_rows:
            self.flush()

    def flush(self) -> concurrent.futures.Future | None:
        """Hand the buffered results (and a checkpoint) to the writer thread; returns its future."""
        if self._closed:
            return None
        batches = self._buf.take()
        ckpt = self._checkpoint() if self._checkpoint else None
        if not batches and ckpt is None:
            return None
        return self._pool.submit(self._write, batches, ckpt)

    def _write(self, batches: list[pa.RecordBatch], ckpt: dict | None) -> None:
        with self._lock:
            if batches:
                path = os.path.join(self.parts_dir, f"part-{self._seq:08d}.parquet")
                self._seq += 1
                table = batches_to_table(batches)
                _atomic_write_table(table.replace_schema_metadata(self._schema.metadata), path)
                self._parts.append(path)
                self._part_rows += table.num_rows
                self.rows_written += table.num_rows
            if ckpt is not None:
                tmp = os.path.join(self.dir, "checkpoint.json.tmp")
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump(ckpt, f)
                os.replace(tmp, os.path.join(self.dir, "checkpoint.json"))
            due = (self.roll_rows is not None and self._part_rows >= self.roll_rows) or (
                self.roll_interval_s is not None and time.monotonic() - self._last_roll >= self.roll_interval_s)
            if due:
                self._roll(final=False)

    def _roll(self, *, final: bool) -> None:
        """Merge this run's parts into one rolled file (caller holds the lock)."""
        self._last_roll = time.monotonic()
        if not self._parts:
            return
        single = final and not glob.glob(os.path.join(self.dir, "requests*.parquet"))
        if single:
            dst = os.path.join(self.dir, "requests.parquet")
        else:
            n = len(glob.glob(os.path.join(self.dir, "requests-*.parquet")))
            dst = os.path.join(self.dir, f"requests-{n:05d}.parquet")
        # part by part, in row groups of ~ROLL_GROUP_ROWS: the end of a days-long run without
        # --roll-* holds one row group in memory, not every result of the run
        tmp = dst + ".tmp"
        with open(tmp, "wb") as f, pq.ParquetWriter(f, self._schema, compression="zstd") as w:
            group: list[pa.Table] = []
            rows = 0
            for p in self._parts:
                t = pq.read_table(p)
                group.append(t)
                rows += t.num_rows
                if rows >= ROLL_GROUP_ROWS:
                    w.write_table(pa.concat_tables(group))
                    group, rows = [], 0
            if group:
                w.write_table(pa.concat_tables(group))
        os.replace(tmp, dst)
        for p in self._parts:
            os.remove(p)
        self._parts = []
        self._part_rows = 0

    async def run_periodic_flush(self) -> None:
        """Flush every ``flush_interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.flush_interval_s)
            self.flush()

    def close(self) -> None:
        """Write what is buffered, roll the parts into the final file. Blocking; idempotent."""
        if self._closed:
            return
        fut = self.flush()
        if fut is not None:
            fut.result()
        self._closed = True
        self._pool.shutdown(wait=True)
        with self._lock:
            self._roll(final=True)
        try:  # an empty parts/ left in every finished folder (target-metric parts go first)
            os.rmdir(self.parts_dir)
        except OSError:
            pass


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
        return (f"holds an earlier run's results ({len(files)} results file(s)); --resume {resume or results_dir} "
                "continues that run, another --results starts a new one")
    return None


def result_files(results_dir: str) -> list[str]:
    """Every results file of a results folder: rolled files, then parts not yet rolled."""
    files = sorted(glob.glob(os.path.join(results_dir, "requests*.parquet")))
    return files + sorted(glob.glob(os.path.join(results_dir, PARTS, "part-*.parquet")))


def drop_not_started(results_dir: str) -> int:
    """Remove the ``not_started`` records (rows a stopped run never sent) from the results files
    of ``results_dir``: a resumed run sends those rows and records them anew, and the folder must
    hold each row once. Each file holding such records is rewritten through a temporary file and
    a rename (removed if nothing else is in it). Returns the number of records removed."""
    removed = 0
    for f in result_files(results_dir):
        unsent = pc.equal(pq.read_table(f, columns=["outcome"]).column("outcome"), "not_started")
        n = pc.sum(unsent).as_py() or 0
        if not n:
            continue
        table = pq.read_table(f)
        kept = table.filter(pc.invert(pc.equal(table.column("outcome"), "not_started")))
        if kept.num_rows:
            _atomic_write_table(kept, f, buffered=False)
        else:
            os.remove(f)
        removed += n
    return removed


def read_results(path: str, columns: list[str] | None = None) -> pa.Table:
    """All results of a results folder (or one file) as one Arrow table (schema ``SCHEMA``, or
    only ``columns`` of it: reading a long soak's results whole takes a lot of memory)."""
    files = [path] if os.path.isfile(path) else result_files(path)
    if not files:
        empty = SCHEMA.empty_table()
        return empty.select(columns) if columns else empty
    return pa.concat_tables([pq.read_table(f, columns=columns).replace_schema_metadata(None) for f in files])
