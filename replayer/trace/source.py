"""Streaming: :class:`TraceSource` and :func:`open_trace`.

Canonical Parquet is streamed batch by batch (``_ParquetSource``); JSONL and CSV are read whole,
validated and sorted, then served in slices (``_LoadedSource``, :func:`slice_rows`).
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from replayer.trace.columns import _raw_from_table
from replayer.trace.mapping import _Opts, _src
from replayer.trace.model import (
    MAX_PROBLEMS,
    TIME_UNITS,
    Trace,
    TraceError,
    TraceProblem,
    _cut_optional,
    _Problems,
    _readonly,
)
from replayer.trace.parquet import _parquet_meta, is_capture_folder, replayable_rows, trace_paths
from replayer.trace.read import _finish, _resolve, _Sessions, read_trace

# --------------------------------------------------------------------------------------------
# Streaming


class TraceSource:
    """A trace opened for streaming (:func:`open_trace`).

    * ``path``; ``num_rows``: rows in the whole trace (``None`` if unknown); ``metadata`` (as
      :attr:`Trace.metadata`); ``block_size`` (tokens per hash id).
    * :meth:`batches` yields :class:`Trace` objects of at most ``max_rows`` consecutive rows in
      arrival order. Each has ``timestamp_ns`` as offsets from the trace's first timestamp (one
      global origin, not per batch) and ``row_offset`` = index of its first row in the whole trace.
    * :meth:`validate` streams over everything and raises one :class:`TraceError` listing every
      problem (capped), keeping no rows: call it before sending anything.
    * ``parent_request_id`` chains are followed across batches (memory: one entry per request id
      of a trace with that column). Turn order within a session is checked across the whole trace
      by :meth:`validate` (memory: one entry per session of a trace with ``session_id`` and
      ``turn``) but only within each batch by :meth:`batches`.
    """

    path: str
    num_rows: int | None
    metadata: dict[str, str]
    block_size: int

    def batches(self, max_rows: int = 65_536):  # pragma: no cover - interface
        raise NotImplementedError

    def span_ns(self, rows: int | None = None) -> int | None:
        """Trace time (ns) from the first arrival to the last of the first ``rows`` rows (all
        when None), or None when it is not known without reading the rows."""
        return None

    def validate(self) -> None:
        problems: list[TraceProblem] = []
        for _ in self._iter(65_536, problems):
            pass
        if problems:
            raise TraceError(problems)

    def _iter(self, max_rows: int, problems: list | None):  # pragma: no cover - interface
        raise NotImplementedError


class _LoadedSource(TraceSource):
    """JSONL / CSV (and anything needing a sort): read whole, sorted, then served in slices."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.path = trace.path
        self.num_rows = len(trace)
        self.metadata = dict(trace.metadata)
        self.block_size = trace.block_size

    def batches(self, max_rows: int = 65_536):
        return self._iter(max_rows, None)

    def span_ns(self, rows: int | None = None) -> int | None:
        ts = self.trace.timestamp_ns
        k = min(len(ts), rows or len(ts))
        return int(ts[k - 1]) - int(ts[0]) if k else 0

    def _iter(self, max_rows: int, problems: list | None):
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        t = self.trace
        for start in range(0, len(t), max_rows):
            yield slice_rows(t, start, min(len(t), start + max_rows))


def slice_rows(t: Trace, a: int, b: int) -> Trace:
    """Rows ``a:b`` of ``t`` as a Trace sharing its arrays (``row_offset`` advanced by ``a``)."""
    ha, hb = int(t.hash_offsets[a]), int(t.hash_offsets[b])
    return Trace(
        path=t.path,
        timestamp_ns=t.timestamp_ns[a:b],
        input_length=t.input_length[a:b],
        output_length=t.output_length[a:b],
        hash_offsets=_readonly(t.hash_offsets[a : b + 1] - ha),
        hash_values=t.hash_values[ha:hb],
        block_size=t.block_size,
        source_row=t.source_row[a:b],
        rows_out_of_order=t.rows_out_of_order if a == 0 else 0,
        metadata=t.metadata,
        row_offset=t.row_offset + a,
        hash_ids_synthetic=t.hash_ids_synthetic,
        **_cut_optional(t, slice(a, b)),
    )


class _ParquetSource(TraceSource):
    """Canonical Parquet file / folder / glob, streamed with ``ParquetFile.iter_batches``.

    Rows must already be in time order across batches (``trace convert`` writes them so); a batch
    that goes back in time raises TraceError. Rows out of order *within* one batch are stable-sorted
    there (warning; an error with ``strict``), which equals the global sort.
    """

    num_rows: int  # known: from the files' footers

    def __init__(self, path: str, files: list[str], opts: _Opts):
        self.path = path
        self.files = files
        self.opts = opts
        probs = _Problems(path)
        rows = 0
        meta0 = None
        for f in files:
            try:
                md = pq.ParquetFile(f)
            except (pa.ArrowException, OSError, ValueError) as e:
                probs.add(0, "file", f"not a readable Parquet file: {e}", file=f)
                continue
            rows += md.metadata.num_rows
            if meta0 is None:
                fp = _Problems(f)
                meta0, bs = _parquet_meta(md.schema_arrow.metadata, fp, opts)
                probs.items.extend(fp.items)
        probs.raise_if_any()
        assert meta0 is not None  # every file was read (else raise_if_any raised)
        self.num_rows = rows
        self.metadata = meta0
        self.block_size = bs

    def batches(self, max_rows: int = 65_536):
        return self._iter(max_rows, None)

    def span_ns(self, rows: int | None = None) -> int | None:
        """From the row-group statistics of an integer ``timestamp`` column (no rows read); None
        for a prefix of the rows, date-time timestamps or files written without statistics."""
        if rows is not None and rows < self.num_rows:
            return None
        ns = TIME_UNITS.get(self.metadata.get("time_unit", ""))
        name = _src(self.opts, "timestamp")
        lo: int | None = None
        hi: int | None = None
        for f in self.files:
            md = pq.ParquetFile(f).metadata
            names = [md.schema.column(i).name for i in range(md.num_columns)]
            if ns is None or name not in names:
                return None
            col = names.index(name)
            for g in range(md.num_row_groups):
                st = md.row_group(g).column(col).statistics
                if st is None or not st.has_min_max or type(st.min) is not int:  # (date-times: not)
                    return None
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
        if lo is None or hi is None or ns is None:
            return None
        return (hi - lo) * ns

    def _iter(self, max_rows: int, problems: list | None):  # noqa: C901, PLR0912
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        origin = None
        ns0 = None
        prev_max = None
        offset = 0
        synth = 0
        sessions = _Sessions()  # parent chains always span batches; turn order only in validate()
        for f in self.files:
            pf = pq.ParquetFile(f)
            fp = _Problems(f)
            meta, bs = _parquet_meta(pf.schema_arrow.metadata, fp, self.opts)
            if fp:
                if problems is None:
                    fp.raise_if_any()
                assert problems is not None  # (raise_if_any raised)
                problems.extend(fp.items)
                continue
            row = 1
            file_meta = pf.schema_arrow.metadata
            for rb in pf.iter_batches(batch_size=max_rows):
                table, rows = replayable_rows(pa.Table.from_batches([rb]).replace_schema_metadata(file_meta), row)
                row += rb.num_rows
                n = table.num_rows
                if n == 0 and rb.num_rows:  # a capture's batch with no replayable row
                    continue
                bp = _Problems(f)
                raw = _raw_from_table(table, bp, dict(meta), bs, self.opts, rows, synth)
                del table, rb
                try:
                    if raw is None:
                        bp.raise_if_any()
                        continue
                    if ns0 is not None and raw.ns_per_unit != ns0:
                        bp.add(0, "metadata", "shards disagree on replayer.time_unit")
                        bp.raise_if_any()
                    if origin is None and raw.ts_ok.all():
                        origin, ns0 = int(raw.ts.min()), raw.ns_per_unit
                    if raw.metadata.get("hash_ids") == "synthesised":
                        synth += int(raw.hash_len.sum())
                    if problems is None:  # batches(): turn order within the batch (no per-session memory)
                        sessions.last_turn.clear()
                    batch = _finish(
                        raw,
                        bp,
                        self.path,
                        self.opts.strict,
                        origin=origin,
                        not_before=prev_max,
                        row_offset=offset,
                        stacklevel=4,
                        sessions=sessions,
                    )
                except TraceError as e:
                    if problems is None:
                        raise
                    problems.extend(e.problems)
                    if len(problems) > 10 * MAX_PROBLEMS:
                        return
                    offset += n
                    continue
                offset += n
                if n:
                    last = int(raw.ts.max())
                    prev_max = last if prev_max is None else max(prev_max, last)
                if problems is None:
                    yield batch


def open_trace(
    path: str | os.PathLike,
    *,
    fmt: str = "auto",
    block_size: int | None = None,
    strict: bool = False,
    mapping: str | dict[str, str] | None = None,
    time_unit: str | None = None,
) -> TraceSource:
    """Open a trace for streaming; options as :func:`read_trace`.

    Parquet (file, folder or glob) is streamed batch by batch (memory bounded by ``max_rows``);
    it must be sorted across row groups (a row group going back in time raises TraceError telling
    the user to run ``trace convert``). JSONL and CSV are read whole, validated and sorted first
    (they have no row groups), then served in batches. Raises TraceError at open for a missing or
    unreadable file or bad metadata; row problems surface in :meth:`TraceSource.validate` or when
    the batch holding them is read.
    """
    path = os.fspath(path)
    probs = _Problems(path)
    opts = _resolve(path, fmt, block_size, strict, mapping, time_unit, probs)
    if opts is None:
        raise TraceError(probs.items)
    if opts.fmt == "parquet" and is_capture_folder(path):  # rows in completion order: read whole, sorted
        return _LoadedSource(
            read_trace(path, fmt=opts.fmt, block_size=block_size, strict=strict, mapping=mapping, time_unit=time_unit)
        )
    if opts.fmt == "parquet":
        files = trace_paths(path)
        if not files:
            raise TraceError([TraceProblem(path, 0, "file", "no Parquet files match (folder or glob is empty)")])
        if len(files) == 1 and not os.path.exists(files[0]):
            raise TraceError([TraceProblem(path, 0, "file", "no such file")])
        return _ParquetSource(path, files, opts)
    return _LoadedSource(
        read_trace(path, fmt=opts.fmt, block_size=block_size, strict=strict, mapping=mapping, time_unit=time_unit)
    )
