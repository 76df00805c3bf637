"""Whole-trace reading: option resolution, whole-row checks, sorting and :func:`read_trace`.

``_resolve`` turns the user's options into ``_Opts`` (format detection by extension);
``_finish`` checks what needs whole rows (hash id counts, time order, session turns), derives
session ids of ``parent_request_id`` chains, stable-sorts and builds the :class:`Trace`; the
streaming source (``source.py``) reuses both per batch.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from replayer.trace.agentic import AGENTIC_FORMATS, sniff
from replayer.trace.columns import _check_hash_counts, _Raw
from replayer.trace.copilot import _read_copilot
from replayer.trace.csv import AZURE_COLUMNS, _read_csv, _sniff_csv_header
from replayer.trace.jsonl import _read_jsonl, _read_servegen
from replayer.trace.mapping import _AZURE_MAP, _Opts, parse_mapping
from replayer.trace.model import (
    _INT64_MAX,
    _OPTIONAL,
    FORMATS,
    READ_TIME_UNITS,
    Trace,
    TraceError,
    TraceOrderWarning,
    TraceProblem,
    TraceUnitWarning,
    _Problems,
    _readonly,
)
from replayer.trace.parquet import _read_parquet, is_capture_folder
from replayer.trace.tracelab import _read_tracelab
from replayer.trace.weka import _read_weka

# --------------------------------------------------------------------------------------------
# Public API


def _resolve(
    path: str, fmt: str, block_size: int | None, strict: bool, mapping, time_unit: str | None, probs: _Problems
) -> _Opts | None:
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1):
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if time_unit is not None and time_unit not in READ_TIME_UNITS:
        raise ValueError(f"time_unit must be one of {', '.join(READ_TIME_UNITS)}, got {time_unit!r}")
    mapping = parse_mapping(mapping)
    kind = fmt
    if fmt == "auto":
        ext = os.path.splitext(path[:-3] if path.lower().endswith(".gz") else path)[1].lower()
        agentic = sniff(path) if ext in (".jsonl", ".json") and not (mapping or time_unit) else None
        if agentic:
            kind = agentic
        elif (
            os.path.isdir(path)
            or ext in (".parquet", ".pq")
            or (any(c in path for c in "*?[") and not os.path.exists(path))
        ):
            kind = "parquet"
        elif ext in (".jsonl", ".json"):
            kind = "jsonl" if (mapping or time_unit) else ("servegen" if _is_servegen(path) else "mooncake")
        elif ext == ".csv":
            head = set(_sniff_csv_header(path))
            kind = "azure" if (not mapping and len(head.intersection(AZURE_COLUMNS)) >= 2) else "csv"
        else:
            probs.add(
                0,
                "format",
                f"unknown trace format for extension {ext or '(none)'!r}: expected "
                ".parquet/.pq or a folder/glob of them (canonical), .jsonl/.json "
                "(Mooncake or generic JSONL) or .csv (Azure or generic CSV); "
                "or name the format explicitly",
            )
            return None
    elif fmt not in FORMATS:
        probs.add(0, "format", f"unknown trace format {fmt!r}: expected 'auto' or one of {', '.join(FORMATS)}")
        return None
    if kind == "azure":
        mapping = {**_AZURE_MAP, **mapping}
    if kind == "mooncake" and time_unit not in (None, "ms"):
        kind = "jsonl"
    allow_float = kind in ("mooncake", "jsonl", "csv", "azure", "servegen") or time_unit is not None
    return _Opts(kind, block_size, strict, mapping, time_unit, allow_float)


def _is_servegen(path: str) -> bool:
    """A JSONL file whose first row has ServeGen's ``img_ids`` and no ``timestamp``."""
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 20)
    except OSError:
        return False
    return b'"img_ids"' in first and b'"timestamp"' not in first


class _Sessions:
    """Session state carried from batch to batch in sorted order (one per pass over a trace).

    ``last_turn``: session id -> (turn, row) of its latest checked row (turn order check).
    ``roots``: request id -> root request id of its ``parent_request_id`` chain.
    """

    def __init__(self) -> None:
        self.last_turn: dict[str, tuple[int, int]] = {}
        self.roots: dict[str, str] = {}


def _check_turns(raw: _Raw, order: np.ndarray | None, probs: _Problems, state: _Sessions) -> None:
    """Turns of each session (as given in the file) must strictly increase in sorted time order.

    Rows with a ``parent_request_id`` are left out: a chain may branch (two answers to one turn).
    """
    sess, turns = raw.optional.get("session_id"), raw.optional.get("turn")
    if sess is None or turns is None:
        return
    parent = raw.optional.get("parent_request_id")
    last = state.last_turn
    for i in order.tolist() if order is not None else range(len(sess)):
        s, t = sess[i], turns[i]
        if s is None or t is None or (parent is not None and parent[i] is not None):
            continue
        row = int(raw.rows[i])
        prev = last.get(s)
        if prev is not None and t <= prev[0]:
            probs.add(
                row,
                "turn",
                f"turn {t} of session {s!r} does not follow turn {prev[0]} (row {prev[1]}): "
                "turns of a session must strictly increase in time order",
                file=raw.file_of(i),
            )
        last[s] = (t, row)


def _derive_sessions(session: list | None, request_id: list | None, parent: list, roots: dict[str, str]) -> list:
    """``session_id`` with the chain root filled in where it is missing (rows in sorted order).

    root(row) = root(parent) when the parent appeared earlier (``roots``), else the parent id
    itself; a row without a parent is the root of its own chain (root = its ``request_id``).
    """
    n = len(parent)
    out = list(session) if session is not None else [None] * n
    for i in range(n):
        p = parent[i]
        r = request_id[i] if request_id is not None else None
        root = roots.get(p, p) if p is not None else r
        if r is not None and root is not None:
            roots[r] = root
        if out[i] is None:
            out[i] = root
    return out


def _warn_seconds(path: str, raw: _Raw) -> None:
    """Warn when timestamps read in the default unit (ms) look like seconds: a fractional value
    (0, 1.5), or under 1 ms between rows on average (a second-resolution log read as ms is 1,000
    times faster)."""
    ns = raw.ns_per_unit
    ts = raw.ts
    if ts.shape[0] == 0:
        return
    fractional = ns < 1_000_000 and bool(np.any(ts % (1_000_000 // ns)))
    span_ms = (int(ts.max()) - int(ts.min())) * ns / 1e6
    dense = ts.shape[0] > 1 and span_ms / (ts.shape[0] - 1) <= 1
    if not (fractional or dense):
        return
    why = "some are fractional" if fractional else f"{ts.shape[0]:,} rows span {span_ms:g} ms"
    warnings.warn(
        f"{path}: timestamps read as milliseconds (the default for generic traces), but {why}: "
        "if they are seconds, pass --time-unit s",
        TraceUnitWarning,
        stacklevel=3,
    )


def _check_times(raw: _Raw, probs: _Problems, origin: int | None, not_before: int | None, strict: bool) -> int:
    """The whole-column timestamp checks (not before an earlier row group's, within int64 ns of
    the first, sorted when ``strict``); returns how many rows are out of timestamp order."""
    ts = raw.ts
    tmin = int(ts.min()) if origin is None else int(origin)
    if not_before is not None and int(ts.min()) < not_before:
        i = int(np.flatnonzero(ts < not_before)[0])
        probs.add(
            raw.rows[i],
            "timestamp",
            f"timestamp {int(ts[i])} goes back in time: an earlier row group reached {not_before}; "
            "this Parquet source is not sorted - run `replayer trace convert` (which sorts) first",
            file=raw.file_of(i),
        )
    span_limit = _INT64_MAX // raw.ns_per_unit
    for i in np.flatnonzero((ts - tmin) > span_limit).tolist():
        probs.add(
            raw.rows[i],
            "timestamp",
            f"timestamp {int(ts[i])} is too far from the first ({tmin}) to fit in int64 nanoseconds",
            file=raw.file_of(i),
        )
    if ts.shape[0] <= 1:
        return 0
    prev_max = np.maximum.accumulate(ts)[:-1]
    late = ts[1:] < prev_max
    rows_out = int(late.sum())
    if rows_out and strict:
        first = int(np.flatnonzero(late)[0]) + 1
        probs.add(
            raw.rows[first],
            "timestamp",
            f"{rows_out} rows out of timestamp order (first here: {int(ts[first])} after "
            f"{int(prev_max[first - 1])}); strict mode requires sorted timestamps",
            file=raw.file_of(first),
        )
    return rows_out


def _sorted_hashes(raw: _Raw, order: np.ndarray, hash_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The hash ids' offsets and values with the rows in ``order`` (whole rows move together)."""
    n = order.shape[0]
    new_len = raw.hash_len[order]
    new_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(new_len, out=new_off[1:])
    gather = np.repeat(hash_offsets[:-1][order] - new_off[:-1], new_len) + np.arange(new_off[-1], dtype=np.int64)
    return new_off, raw.hash_vals[gather]


def _finish(
    raw: _Raw,
    probs: _Problems,
    path: str,
    strict: bool,
    *,
    origin: int | None = None,
    not_before: int | None = None,
    row_offset: int = 0,
    stacklevel: int = 3,
    sessions: _Sessions | None = None,
) -> Trace:
    """Checks that need whole rows, then sort and build the Trace.

    ``origin`` (raw units): time 0 (default: the smallest timestamp). ``not_before`` (raw units):
    streaming only; a row earlier than this is an error (an earlier row group went past it).
    ``sessions``: streaming only; state from the batches before this one.
    """
    if sessions is None:
        sessions = _Sessions()
    if raw.shard_files is None:  # shards were checked one by one (problems name the shard)
        _check_hash_counts(raw, probs)
    ts = raw.ts
    ns = raw.ns_per_unit
    rows_out = 0
    order = None
    if raw.ts_ok.all():
        rows_out = _check_times(raw, probs, origin, not_before, strict)
        order = np.argsort(ts, kind="stable") if rows_out else None
        _check_turns(raw, order, probs, sessions)
    probs.raise_if_any()

    n = ts.shape[0]
    offsets_ns = (ts - (ts.min() if origin is None else origin)) * ns
    hash_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(raw.hash_len, out=hash_offsets[1:])
    hash_values = raw.hash_vals
    if rows_out:
        warnings.warn(
            f"{path}: {rows_out} rows out of timestamp order; rows were stable-sorted by "
            "timestamp (whole rows move together)",
            TraceOrderWarning,
            stacklevel=stacklevel,
        )
        hash_offsets, hash_values = _sorted_hashes(raw, order, hash_offsets)  # type: ignore[arg-type]

    def take(a: np.ndarray) -> np.ndarray:
        return _readonly(np.ascontiguousarray(a[order] if order is not None else a, dtype=np.int64))

    def take_list(lst: list | None) -> list | None:
        if lst is None:
            return None
        return [lst[i] for i in order] if order is not None else list(lst)

    opt = {name: take_list(raw.optional.get(name)) for name in _OPTIONAL if name != "think_time_s"}
    think = raw.optional.get("think_time_s")
    if think is not None:
        think = _readonly(np.ascontiguousarray(think[order] if order is not None else think, dtype=np.float64))
    if opt["parent_request_id"] is not None:
        opt["session_id"] = _derive_sessions(
            opt["session_id"], opt["request_id"], opt["parent_request_id"], sessions.roots
        )
    return Trace(
        path=path,
        timestamp_ns=take(offsets_ns),
        input_length=take(raw.il),
        output_length=take(raw.ol),
        hash_offsets=_readonly(hash_offsets),
        hash_values=_readonly(np.ascontiguousarray(hash_values, dtype=np.int64)),
        block_size=raw.block_size,
        source_row=take(raw.rows),
        rows_out_of_order=rows_out,
        metadata=raw.metadata,
        row_offset=row_offset,
        think_time_s=think,
        hash_ids_synthetic=raw.metadata.get("hash_ids") == "synthesised",
        **opt,
    )


#: Leading bytes of files that are not text -> what they are.
_MAGIC = {
    b"PAR1": "a Parquet file: name it .parquet (or give --format parquet)",
    b"\x1f\x8b": "gzip-compressed data: decompress it first (gunzip)",
    b"\x28\xb5\x2f\xfd": "zstd-compressed data: decompress it first (unzstd)",
    b"PK\x03\x04": "a zip archive: extract the trace first",
    b"\xff\xfe": "UTF-16 text: convert it to UTF-8 (iconv -f UTF-16 -t UTF-8)",
    b"\xfe\xff": "UTF-16 text: convert it to UTF-8 (iconv -f UTF-16 -t UTF-8)",
}


def _not_text(path: str, fmt: str) -> str | None:
    """Why the file at ``path``, read as ``fmt``, is not UTF-8 text (judged on its first 64 KiB), or None.

    A text format (JSONL, CSV) given binary data would otherwise give one problem per line
    ("str is not valid UTF-8"); this gives one about the file."""
    import codecs

    try:
        with open(path, "rb") as f:
            head = f.read(65536)
    except OSError:
        return None  # (the reader reports it)
    for magic, what in _MAGIC.items():
        if head.startswith(magic):
            return f"not a text file but {what}"
    expected = f"the {fmt} format is UTF-8 {'CSV' if fmt in ('csv', 'azure') else 'JSON lines'}"
    nul = head.find(b"\x00")
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head[:nul] if nul >= 0 else head, final=False)
    except UnicodeDecodeError as e:
        return f"not a text file (byte {e.start} is 0x{head[e.start]:02x}, not UTF-8): {expected}"
    if nul >= 0:
        return f"not a text file (byte {nul} is 0x00): {expected}"
    return None


_READERS = {
    "parquet": _read_parquet,
    "mooncake": _read_jsonl,
    "jsonl": _read_jsonl,
    "csv": _read_csv,
    "azure": _read_csv,
    "weka": _read_weka,
    "copilot": _read_copilot,
    "tracelab": _read_tracelab,
    "servegen": _read_servegen,
}


def read_trace(
    path: str | os.PathLike,
    *,
    fmt: str = "auto",
    block_size: int | None = None,
    strict: bool = False,
    mapping: str | dict[str, str] | None = None,
    time_unit: str | None = None,
) -> Trace:
    """Read and validate a whole trace; return its rows stable-sorted by timestamp.

    ``path``: a file, or (Parquet) a folder of ``*.parquet`` shards or a glob; shards are read in
    name order as one trace. ``fmt``: ``"auto"`` (by extension: ``.parquet``/``.pq``/folder/glob
    -> ``parquet``; ``.jsonl``/``.json`` -> ``mooncake``, or ``jsonl`` when a mapping or time unit
    is given; ``.csv`` -> ``azure`` when the header has ``TIMESTAMP,ContextTokens,GeneratedTokens``,
    else ``csv``) or one of :data:`FORMATS`:

    * ``parquet``: canonical Parquet (``docs/reference/trace-formats.md``); time unit from ``replayer.time_unit``.
    * ``mooncake``: Mooncake FAST'25 trace release JSONL (kvcache-ai/Mooncake
      ``FAST25-release/traces``): ms ``timestamp`` (fractions kept exactly, half-even to the ns),
      ``input_length``, ``output_length``, ``hash_ids`` (block 512).
    * ``azure``: Azure Public Dataset AzureLLMInferenceTrace 2023 CSV (Splitwise, ISCA 2024):
      ``TIMESTAMP`` (date-time, 7 fractional digits, no zone), ``ContextTokens``,
      ``GeneratedTokens``. No prefix information: row blocks get unique ids from
      :data:`SYNTH_ID_BASE` (k-th block of the file, in file order).
    * ``jsonl`` / ``csv``: generic files; ``mapping`` names the source column of each field
      (:func:`parse_mapping`; ``hash_ids=`` empty -> synthesised unique ids); ``time_unit`` is one
      of ``s``, ``ms`` (default), ``us``, ``ns`` (numbers, fractions allowed) or ``datetime``
      (ISO-8601 strings; offsets from the first). CSV ``hash_ids`` cells hold a JSON list.

    Hash ids may be integers (0 <= id < 2**64) or strings (:func:`hash_id_from_string`: decimal
    digits are the integer they spell, fixed-width hex its value, other strings are hashed).
    ``block_size``: tokens per hash id; ``None`` -> Parquet ``replayer.block_size`` metadata, else
    512. ``strict``: rows out of timestamp order are an error instead of a :class:`TraceOrderWarning`.

    Raises :class:`TraceError` listing every problem (file, row, field, message; rows are 1-based
    data rows for Parquet, line numbers for JSONL and CSV where the header is line 1): missing,
    unreadable or empty file; corrupt Parquet; unknown format; missing required column; invalid
    JSON line; a value of the wrong type, null, NaN or non-integer; ``timestamp`` < 0 or not a
    date-time; ``input_length`` or ``output_length`` < 1; a ``hash_ids`` that is not a list of ids
    or whose length is not ``ceil(input_length / block_size)``; ``turn`` < 0 or not increasing
    within its session in time order; ``think_time_s`` < 0 or infinite; an ``endpoint`` not in
    :data:`ENDPOINTS`; ``query_length`` < 1; ``document_lengths`` not a non-empty list of ints >= 1;
    ``query_length`` without ``document_lengths``; ``query_length`` + sum(``document_lengths``) !=
    ``input_length``; a ``/v1/score`` or ``/v1/rerank`` row without both. ValueError for a bad
    ``block_size``, ``time_unit`` or ``mapping``.

    Session columns (rules in ``docs/reference/trace-formats.md``): a row with ``parent_request_id`` and no
    ``session_id`` gets ``session_id`` = the root request id of its chain (followed through earlier
    rows; a parent that is not in the trace is itself the root); in a trace with that column, a row
    with a ``request_id`` and neither gets its own ``request_id``, so a chain is one session.
    """
    path = os.fspath(path)
    probs = _Problems(path)
    opts = _resolve(path, fmt, block_size, strict, mapping, time_unit, probs)
    if opts is None:
        raise TraceError(probs.items)
    if opts.fmt != "parquet" and not os.path.exists(path):
        probs.add(0, "file", "no such file")
        raise TraceError(probs.items)
    why = _not_text(path, opts.fmt) if opts.fmt not in ("parquet", *AGENTIC_FORMATS) and os.path.isfile(path) else None
    if why:
        raise TraceError([TraceProblem(path, 0, "file", why)])
    raw = _READERS[opts.fmt](path, probs, opts)
    if raw is None:
        probs.raise_if_any()
        raise TraceError([TraceProblem(path, 0, "file", "no rows (empty trace)")])  # pragma: no cover
    if opts.fmt in ("csv", "jsonl") and opts.time_unit is None and raw.ts_ok.all():
        _warn_seconds(path, raw)
    if opts.fmt == "parquet" and is_capture_folder(path):  # written in completion order on purpose
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceOrderWarning)
            return _finish(raw, probs, path, strict)
    return _finish(raw, probs, path, strict)
