"""Trace loading, validation and conversion.

A *trace* is a list of requests: when each one arrives, how many prompt tokens it has, how many
tokens it must generate, and which prompt blocks (``hash_ids``) it shares with other requests.

Two input formats are read:

* **Mooncake JSONL** (the FAST'25 Mooncake trace release, ``FAST25-release/traces/*.jsonl`` in the
  kvcache-ai/Mooncake repository): one JSON object per line with ``timestamp`` (integer ms from the
  trace start), ``input_length`` (prompt tokens), ``output_length`` (tokens generated) and
  ``hash_ids`` (list of integer block ids, block size 512 tokens). Optional keys ``request_id``,
  ``session_id``, ``model``, ``priority`` and ``extra_body`` are read as in the canonical schema;
  other keys are ignored. Blank lines are skipped; rows are numbered by physical line. A ``.json``
  file whose first character is ``[`` is read as a JSON array of such objects (rows numbered from 1).
* **Canonical Parquet** (``traces/README.md`` documents it exactly): columns ``timestamp``,
  ``input_length``, ``output_length`` (int64), ``hash_ids`` (list<int64>), optional ``request_id``,
  ``session_id``, ``model`` (string), ``priority`` (int64), ``extra_body`` (string holding a JSON
  object); file metadata ``replayer.schema_version``, ``replayer.block_size``,
  ``replayer.time_unit``, ``replayer.source``, ``replayer.license``.

``read_trace`` validates the whole file and raises one :class:`TraceError` that lists every problem
(file, 1-based row, field, message). Rows are then stable-sorted by timestamp as whole rows (a
timestamp never gets another row's lengths) and times become int64 nanosecond offsets from the
smallest timestamp.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = [
    "TraceProblem",
    "TraceError",
    "TraceOrderWarning",
    "Trace",
    "read_trace",
    "write_parquet",
    "convert",
    "SCHEMA_VERSION",
    "DEFAULT_BLOCK_SIZE",
    "TIME_UNITS",
]

SCHEMA_VERSION = "1"
DEFAULT_BLOCK_SIZE = 512
DEFAULT_TIME_UNIT = "ms"
#: Nanoseconds per unit for ``replayer.time_unit``.
TIME_UNITS: dict[str, int] = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
META_PREFIX = "replayer."
MAX_PROBLEMS = 50
ROW_GROUP_SIZE = 65_536

_INT64_MAX = int(np.iinfo(np.int64).max)
_REQUIRED = ("timestamp", "input_length", "output_length", "hash_ids")
_OPTIONAL_STR = ("request_id", "session_id", "model")
_OPTIONAL = ("request_id", "session_id", "model", "priority", "extra_body")
_FIELD_ORDER = {
    name: i
    for i, name in enumerate(
        ("file", "format", "metadata", "json", *_REQUIRED, *_OPTIONAL)
    )
}
_MIN = {"timestamp": 0, "input_length": 1, "output_length": 1}


# --------------------------------------------------------------------------------------------
# Problems and errors


@dataclass(frozen=True)
class TraceProblem:
    """One thing wrong with a trace file.

    ``row`` is the 1-based data row (for JSONL: the physical line number). ``row == 0`` means the
    problem concerns the whole file (missing file, corrupt Parquet, missing column, metadata); it
    is then printed without the row part.
    """

    file: str
    row: int
    field: str
    message: str

    def __str__(self) -> str:
        if self.row <= 0:
            return f"{self.file}: {self.field}: {self.message}"
        return f"{self.file}: row {self.row}: {self.field}: {self.message}"


class TraceError(Exception):
    """A trace file could not be used. ``problems`` lists what was found, sorted by row then field.

    At most ``MAX_PROBLEMS`` (50) problems are kept; ``more`` counts the ones left off. ``str(e)``
    prints each kept problem on its own line, then ``... and N more problems`` when some were cut.
    """

    def __init__(self, problems: list[TraceProblem], *, cap: int = MAX_PROBLEMS):
        ordered = sorted(problems, key=lambda p: (p.row, _FIELD_ORDER.get(p.field, 99)))
        self.problems: list[TraceProblem] = ordered[:cap]
        self.more: int = max(0, len(ordered) - cap)
        self.total: int = len(ordered)
        super().__init__(self._text())

    def _text(self) -> str:
        lines = [str(p) for p in self.problems]
        if self.more:
            lines.append(f"... and {self.more} more problems")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self._text()


class TraceOrderWarning(UserWarning):
    """Rows were not in timestamp order; they were stable-sorted (non-strict mode)."""


class _Problems:
    def __init__(self, file: str):
        self.file = file
        self.items: list[TraceProblem] = []

    def add(self, row: int, field_: str, message: str) -> None:
        self.items.append(TraceProblem(self.file, int(row), field_, message))

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            raise TraceError(self.items)


# --------------------------------------------------------------------------------------------
# The trace


@dataclass(frozen=True, eq=False)
class Trace:
    """A validated trace, rows sorted by arrival time (stable).

    Arrays have one entry per row (``n = len(trace)``) unless stated; all are read-only.

    * ``timestamp_ns`` int64[n]: arrival offset in nanoseconds from the smallest timestamp in the
      file, ascending. Equal timestamps keep file order.
    * ``input_length`` int64[n]: prompt tokens (>= 1). ``output_length`` int64[n]: tokens to
      generate (>= 1).
    * ``hash_offsets`` int64[n+1], ``hash_values`` int64[total]: the hash ids of row ``i`` are
      ``hash_values[hash_offsets[i]:hash_offsets[i+1]]`` (Arrow ListArray layout); every id is >= 0
      and row ``i`` has ``ceil(input_length[i] / block_size)`` of them.
    * ``source_row`` int64[n]: 1-based row number (JSONL: line number) of each row in the source.
    * ``rows_out_of_order``: rows whose timestamp is smaller than the largest timestamp before them.
    * Optional columns (``request_id``, ``session_id``, ``model``: ``str | None``; ``priority``:
      ``int | None``; ``extra_body``: ``str | None`` holding a JSON object) are lists in sorted
      order, or ``None`` when the source has no such column.
    * ``metadata``: ``schema_version``, ``block_size``, ``time_unit`` (unit of the source's
      timestamps), ``source``, ``license``, ``format`` ("parquet" or "mooncake"), without the
      ``replayer.`` prefix.
    """

    path: str
    timestamp_ns: np.ndarray
    input_length: np.ndarray
    output_length: np.ndarray
    hash_offsets: np.ndarray
    hash_values: np.ndarray
    block_size: int
    source_row: np.ndarray
    rows_out_of_order: int
    request_id: list[str | None] | None = None
    session_id: list[str | None] | None = None
    model: list[str | None] | None = None
    priority: list[int | None] | None = None
    extra_body: list[str | None] | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.input_length.shape[0])

    def hash_ids(self, i: int) -> np.ndarray:
        """Hash ids of (sorted) row ``i`` as a read-only int64 view."""
        return self.hash_values[self.hash_offsets[i] : self.hash_offsets[i + 1]]

    @property
    def duration_ns(self) -> int:
        """Offset of the last arrival (0 for an empty or single-timestamp trace)."""
        return int(self.timestamp_ns[-1]) if len(self) else 0

    def head(self, n: int) -> "Trace":
        """The first ``n`` rows (in sorted order) as a new Trace sharing the metadata."""
        n = max(0, min(int(n), len(self)))
        end = int(self.hash_offsets[n])

        def cut(lst):
            return None if lst is None else lst[:n]

        return Trace(
            path=self.path,
            timestamp_ns=self.timestamp_ns[:n],
            input_length=self.input_length[:n],
            output_length=self.output_length[:n],
            hash_offsets=self.hash_offsets[: n + 1],
            hash_values=self.hash_values[:end],
            block_size=self.block_size,
            source_row=self.source_row[:n],
            rows_out_of_order=self.rows_out_of_order,
            request_id=cut(self.request_id),
            session_id=cut(self.session_id),
            model=cut(self.model),
            priority=cut(self.priority),
            extra_body=cut(self.extra_body),
            metadata=dict(self.metadata),
        )


# --------------------------------------------------------------------------------------------
# Value checks (slow paths are only taken for the values that need them)


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, str):
        return "string"
    if isinstance(v, (list, tuple)):
        return "list"
    if isinstance(v, dict):
        return "object"
    if isinstance(v, float):
        return "number"
    return type(v).__name__


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _range_message(field_: str, value: int) -> str:
    if field_ == "timestamp":
        return f"negative timestamp {value}: must be >= 0"
    if field_ == "output_length" and value == 0:
        return ("output_length 0 is not allowed: must be >= 1 "
                "(OpenAI-compatible servers refuse max_tokens 0)")
    if field_ == "hash_ids":
        return f"negative hash id {value}: must be >= 0"
    return f"{field_} {value} is not allowed: must be >= {_MIN.get(field_, 0)}"


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def _coerce_int(v: Any, field_: str, minimum: int) -> tuple[int | None, str | None]:
    """One value -> (int, None) or (None, problem message)."""
    if v is _MISSING:
        return None, "missing"
    if v is None:
        return None, "missing (null)"
    if isinstance(v, bool):
        return None, f"expected an integer, got boolean {v!r}"
    if isinstance(v, (int, np.integer)):
        iv = int(v)
    elif isinstance(v, (float, np.floating)):
        fv = float(v)
        if math.isnan(fv):
            return None, "expected an integer, got NaN"
        if math.isinf(fv):
            return None, f"expected an integer, got {fv}"
        if not fv.is_integer():
            return None, f"expected an integer, got non-integer {fv!r}"
        iv = int(fv)
    else:
        return None, f"expected an integer, got {_type_name(v)} {_short(v)}"
    if iv > _INT64_MAX:
        return None, f"value {iv} does not fit in int64"
    if iv < minimum:
        return None, _range_message(field_, iv)
    return iv, None


def _ints_slow(values: list, rows: np.ndarray, field_: str, probs: _Problems) -> tuple[np.ndarray, np.ndarray]:
    minimum = _MIN[field_]
    out = np.zeros(len(values), dtype=np.int64)
    ok = np.ones(len(values), dtype=bool)
    for i, v in enumerate(values):
        iv, err = _coerce_int(v, field_, minimum)
        if err is None:
            out[i] = iv
        else:
            ok[i] = False
            probs.add(rows[i], field_, err)
    return out, ok


def _ints_checked(arr: np.ndarray, rows: np.ndarray, field_: str, probs: _Problems) -> tuple[np.ndarray, np.ndarray]:
    """Vectorized range check of an integer ndarray (signed or unsigned)."""
    minimum = _MIN[field_]
    if arr.dtype.kind == "u":
        too_big = arr > np.uint64(_INT64_MAX)
        for i in np.flatnonzero(too_big):
            probs.add(rows[i], field_, f"value {int(arr[i])} does not fit in int64")
        arr64 = np.where(too_big, 0, arr).astype(np.int64)
        ok = ~too_big
    else:
        arr64 = arr.astype(np.int64, copy=False)
        ok = np.ones(arr64.shape[0], dtype=bool)
    bad = ok & (arr64 < minimum)
    if bad.any():
        for i in np.flatnonzero(bad):
            probs.add(rows[i], field_, _range_message(field_, int(arr64[i])))
        ok &= ~bad
    return arr64, ok


def _ints_from_list(values: list, rows: np.ndarray, field_: str, probs: _Problems) -> tuple[np.ndarray, np.ndarray]:
    if set(map(type, values)) == {int}:  # plain ints only (bool is a subclass of int: excluded here)
        try:
            arr = np.array(values)
        except (ValueError, OverflowError, TypeError):
            arr = None
        if arr is not None and arr.ndim == 1 and arr.dtype.kind in "iu":
            return _ints_checked(arr, rows, field_, probs)
    return _ints_slow(values, rows, field_, probs)


def _hash_slow(lists: list, rows: np.ndarray, probs: _Problems) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row check of hash id lists -> (lengths, flat values, ok)."""
    n = len(lists)
    lengths = np.zeros(n, dtype=np.int64)
    ok = np.ones(n, dtype=bool)
    flat: list[int] = []
    for i, h in enumerate(lists):
        if h is _MISSING:
            ok[i] = False
            probs.add(rows[i], "hash_ids", "missing")
            continue
        if h is None:
            ok[i] = False
            probs.add(rows[i], "hash_ids", "missing (null)")
            continue
        if not isinstance(h, (list, tuple, np.ndarray)):
            ok[i] = False
            probs.add(rows[i], "hash_ids", f"expected a list of integers, got {_type_name(h)} {_short(h)}")
            continue
        vals = []
        errors = []
        for j, v in enumerate(h):
            iv, err = _coerce_int(v, "hash_ids", 0)
            if err is None:
                vals.append(iv)
            else:
                errors.append(f"hash_ids[{j}]: {err}")
        if errors:
            ok[i] = False
            extra = f" (and {len(errors) - 1} more bad ids)" if len(errors) > 1 else ""
            probs.add(rows[i], "hash_ids", errors[0] + extra)
            continue
        lengths[i] = len(vals)
        flat.extend(vals)
    return lengths, np.array(flat, dtype=np.int64), ok


def _hash_from_lists(lists: list, rows: np.ndarray, probs: _Problems) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(lists)
    if all(type(h) is list for h in lists):
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=n)
        flat = list(itertools.chain.from_iterable(lists))
        vals = None
        if not flat:
            vals = np.zeros(0, dtype=np.int64)
        elif set(map(type, flat)) == {int}:  # plain ints only (no bool, float, str, None)
            try:
                vals = np.array(flat)
            except (ValueError, OverflowError, TypeError):
                vals = None
        if (vals is not None and vals.ndim == 1 and vals.dtype.kind in "iu"
                and (vals.size == 0 or (vals.min() >= 0 and (vals.dtype.kind == "i" or vals.max() <= _INT64_MAX)))):
            return lengths, vals.astype(np.int64, copy=False), np.ones(n, dtype=bool)
    return _hash_slow(lists, rows, probs)


def _optional_from_list(name: str, values: list, rows: np.ndarray, probs: _Problems) -> list:
    out: list = []
    for i, v in enumerate(values):
        if v is _MISSING or v is None:
            out.append(None)
            continue
        if name in ("request_id", "session_id"):
            if isinstance(v, str):
                out.append(v)
            elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                out.append(str(int(v)))
            else:
                probs.add(rows[i], name, f"expected a string, got {_type_name(v)} {_short(v)}")
                out.append(None)
        elif name == "model":
            if isinstance(v, str):
                out.append(v)
            else:
                probs.add(rows[i], name, f"expected a string, got {_type_name(v)} {_short(v)}")
                out.append(None)
        elif name == "priority":
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                probs.add(rows[i], name, f"expected an integer, got {_type_name(v)} {_short(v)}")
                out.append(None)
            else:
                out.append(int(v))
        else:  # extra_body
            if isinstance(v, dict):
                out.append(orjson.dumps(v).decode())
            elif isinstance(v, str):
                try:
                    parsed = orjson.loads(v)
                except orjson.JSONDecodeError as e:
                    probs.add(rows[i], name, f"not valid JSON: {e}")
                    out.append(None)
                    continue
                if not isinstance(parsed, dict):
                    probs.add(rows[i], name, f"expected a JSON object, got {_type_name(parsed)}")
                    out.append(None)
                else:
                    out.append(v)
            else:
                probs.add(rows[i], name, f"expected a JSON object (or a string holding one), got {_type_name(v)}")
                out.append(None)
    return out


# --------------------------------------------------------------------------------------------
# Format readers -> raw columns in file order


@dataclass
class _Raw:
    rows: np.ndarray
    ts: np.ndarray
    ts_ok: np.ndarray
    il: np.ndarray
    il_ok: np.ndarray
    ol: np.ndarray
    ol_ok: np.ndarray
    hash_len: np.ndarray
    hash_vals: np.ndarray
    hash_ok: np.ndarray
    optional: dict[str, list]
    ns_per_unit: int
    block_size: int
    metadata: dict[str, str]


def _read_mooncake(path: str, probs: _Problems, block_size: int | None) -> _Raw | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        probs.add(0, "file", f"cannot read: {e.strerror or e}")
        return None
    objs: list[dict] = []
    rows: list[int] = []
    stripped = data.lstrip()
    if stripped.startswith(b"["):
        try:
            arr = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            probs.add(0, "json", f"invalid JSON array: {e}")
            return None
        if not isinstance(arr, list):
            probs.add(0, "json", "expected a JSON array of objects")
            return None
        for k, o in enumerate(arr, 1):
            if isinstance(o, dict):
                objs.append(o)
                rows.append(k)
            else:
                probs.add(k, "json", f"expected a JSON object, got {_type_name(o)}")
    else:
        loads = orjson.loads
        for lineno, line in enumerate(data.split(b"\n"), 1):
            if not line or line.isspace():
                continue
            try:
                o = loads(line)
            except orjson.JSONDecodeError as e:
                probs.add(lineno, "json", f"invalid JSON: {e}")
                continue
            if type(o) is not dict:
                probs.add(lineno, "json", f"expected a JSON object, got {_type_name(o)}")
                continue
            objs.append(o)
            rows.append(lineno)
    if not objs:
        if not probs:
            probs.add(0, "file", "no rows (empty trace)")
        return None
    rows_a = np.array(rows, dtype=np.int64)
    cols = {}
    for name in ("timestamp", "input_length", "output_length"):
        cols[name] = _ints_from_list([o.get(name, _MISSING) for o in objs], rows_a, name, probs)
    hl, hv, hok = _hash_from_lists([o.get("hash_ids", _MISSING) for o in objs], rows_a, probs)
    optional: dict[str, list] = {}
    for name in _OPTIONAL:
        if any(name in o for o in objs):
            optional[name] = _optional_from_list(name, [o.get(name, _MISSING) for o in objs], rows_a, probs)
    bs = block_size if block_size is not None else DEFAULT_BLOCK_SIZE
    return _Raw(rows_a, *cols["timestamp"], *cols["input_length"], *cols["output_length"], hl, hv, hok,
                optional, TIME_UNITS["ms"], bs,
                {"format": "mooncake", "time_unit": "ms", "block_size": str(bs)})


def _column_ints(col: pa.ChunkedArray, rows: np.ndarray, field_: str, probs: _Problems) -> tuple[np.ndarray, np.ndarray]:
    t = col.type
    if pa.types.is_integer(t) and col.null_count == 0:
        return _ints_checked(col.to_numpy(), rows, field_, probs)
    if (pa.types.is_timestamp(t) or pa.types.is_duration(t)) and field_ == "timestamp" and col.null_count == 0:
        return _ints_checked(col.cast(pa.int64()).to_numpy(), rows, field_, probs)
    return _ints_slow(col.to_pylist(), rows, field_, probs)


def _column_hash(col: pa.ChunkedArray, rows: np.ndarray, probs: _Problems) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = col.type
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) \
            and pa.types.is_integer(t.value_type) and col.null_count == 0:
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
        flat = pc.list_flatten(arr)
        if flat.null_count == 0:
            vals = flat.to_numpy(zero_copy_only=False)
            if vals.size == 0 or (vals.min() >= 0 and (vals.dtype.kind == "i" or vals.max() <= _INT64_MAX)):
                return lengths, vals.astype(np.int64, copy=False), np.ones(len(arr), dtype=bool)
    return _hash_slow(col.to_pylist(), rows, probs)


def _read_parquet(path: str, probs: _Problems, block_size: int | None) -> _Raw | None:
    if not os.path.exists(path):
        probs.add(0, "file", "no such file")
        return None
    try:
        pf = pq.ParquetFile(path)
        table = pf.read()
    except (pa.ArrowException, OSError, ValueError) as e:
        probs.add(0, "file", f"not a readable Parquet file: {e}")
        return None
    raw_meta = table.schema.metadata or {}
    meta: dict[str, str] = {"format": "parquet"}
    for k, v in raw_meta.items():
        ks = k.decode("utf-8", "replace")
        if ks.startswith(META_PREFIX):
            meta[ks[len(META_PREFIX):]] = v.decode("utf-8", "replace")
    ver = meta.get("schema_version", SCHEMA_VERSION)
    if ver != SCHEMA_VERSION:
        probs.add(0, "metadata", f"replayer.schema_version {ver!r} is not supported (expected {SCHEMA_VERSION!r})")
    unit = meta.get("time_unit", DEFAULT_TIME_UNIT)
    if unit not in TIME_UNITS:
        probs.add(0, "metadata", f"replayer.time_unit {unit!r} is not one of s, ms, us, ns")
        unit = DEFAULT_TIME_UNIT
    meta["time_unit"] = unit
    if block_size is None:
        bs_text = meta.get("block_size", str(DEFAULT_BLOCK_SIZE))
        try:
            block_size = int(bs_text)
            if block_size < 1:
                raise ValueError
        except ValueError:
            probs.add(0, "metadata", f"replayer.block_size {bs_text!r} is not a positive integer")
            block_size = DEFAULT_BLOCK_SIZE
    meta["block_size"] = str(block_size)
    meta.setdefault("schema_version", SCHEMA_VERSION)

    names = set(table.column_names)
    missing = [c for c in _REQUIRED if c not in names]
    for c in missing:
        probs.add(0, c, f"missing required column (columns present: {', '.join(table.column_names) or 'none'})")
    if missing:
        return None
    if table.num_rows == 0:
        probs.add(0, "file", "no rows (empty trace)")
        return None
    rows = np.arange(1, table.num_rows + 1, dtype=np.int64)
    ns_per_unit = TIME_UNITS[unit]
    ts_col = table.column("timestamp")
    if pa.types.is_timestamp(ts_col.type) or pa.types.is_duration(ts_col.type):
        ns_per_unit = TIME_UNITS[ts_col.type.unit]
        meta["time_unit"] = ts_col.type.unit
    ts, ts_ok = _column_ints(ts_col, rows, "timestamp", probs)
    il, il_ok = _column_ints(table.column("input_length"), rows, "input_length", probs)
    ol, ol_ok = _column_ints(table.column("output_length"), rows, "output_length", probs)
    hl, hv, hok = _column_hash(table.column("hash_ids"), rows, probs)
    optional: dict[str, list] = {}
    for name in _OPTIONAL:
        if name in names:
            optional[name] = _optional_from_list(name, table.column(name).to_pylist(), rows, probs)
    return _Raw(rows, ts, ts_ok, il, il_ok, ol, ol_ok, hl, hv, hok, optional, ns_per_unit, block_size, meta)


# --------------------------------------------------------------------------------------------
# Public API


def _detect_format(path: str, fmt: str, probs: _Problems) -> str | None:
    if fmt == "auto":
        ext = os.path.splitext(path)[1].lower()
        if ext in (".parquet", ".pq"):
            return "parquet"
        if ext in (".jsonl", ".json"):
            return "mooncake"
        probs.add(0, "format", f"unknown trace format for extension {ext or '(none)'!r}: "
                               "expected .parquet/.pq (canonical) or .jsonl/.json (Mooncake); "
                               "or name the format explicitly")
        return None
    if fmt in ("parquet", "mooncake"):
        return fmt
    probs.add(0, "format", f"unknown trace format {fmt!r}: expected 'auto', 'parquet' or 'mooncake'")
    return None


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def read_trace(path: str | os.PathLike, *, fmt: str = "auto", block_size: int | None = None,
               strict: bool = False) -> Trace:
    """Read and validate a trace file; return its rows stable-sorted by timestamp.

    ``fmt``: ``"auto"`` picks by extension (``.parquet``/``.pq`` -> canonical Parquet,
    ``.jsonl``/``.json`` -> Mooncake JSONL), or ``"parquet"`` / ``"mooncake"``.
    ``block_size``: tokens per hash id; ``None`` -> Parquet ``replayer.block_size`` metadata,
    else 512 (Mooncake). An explicit value overrides the metadata.
    ``strict``: rows out of timestamp order are an error instead of a :class:`TraceOrderWarning`.

    Raises :class:`TraceError` listing every problem (file, row, field, message): missing,
    unreadable or empty file; corrupt Parquet; unknown format; missing required column; invalid
    JSON line; a value of the wrong type, null, NaN or non-integer; ``timestamp`` < 0;
    ``input_length`` or ``output_length`` < 1 (``output_length`` 0 is an error); a ``hash_ids`` that
    is not a list of integers >= 0 or whose length is not ``ceil(input_length / block_size)``.
    """
    path = os.fspath(path)
    probs = _Problems(path)
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1):
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    kind = _detect_format(path, fmt, probs)
    if kind is None:
        raise TraceError(probs.items)
    if kind == "mooncake" and not os.path.exists(path):
        probs.add(0, "file", "no such file")
        raise TraceError(probs.items)
    raw = (_read_parquet if kind == "parquet" else _read_mooncake)(path, probs, block_size)
    if raw is None:
        probs.raise_if_any()
        raise TraceError([TraceProblem(path, 0, "file", "no rows (empty trace)")])  # pragma: no cover
    bs = raw.block_size

    # hash_ids count must match the prompt length (checked where both are valid).
    both = raw.il_ok & raw.hash_ok
    expected = (raw.il + (bs - 1)) // bs
    wrong = both & (expected != raw.hash_len)
    for i in np.flatnonzero(wrong):
        e, a, L = int(expected[i]), int(raw.hash_len[i]), int(raw.il[i])
        probs.add(raw.rows[i], "hash_ids",
                  f"expected {e} hash id{'s' if e != 1 else ''} (ceil(input_length {L} / block_size {bs})), got {a}")

    # Timestamps: converted to ns offsets; the span must fit in int64 nanoseconds.
    ts = raw.ts
    ns = raw.ns_per_unit
    rows_out = 0
    if raw.ts_ok.all():
        tmin = int(ts.min())
        span_limit = _INT64_MAX // ns
        too_far = (ts - tmin) > span_limit
        for i in np.flatnonzero(too_far):
            probs.add(raw.rows[i], "timestamp", f"timestamp {int(ts[i])} is too far from the first "
                                                 f"({tmin}) to fit in int64 nanoseconds")
        if ts.shape[0] > 1:
            prev_max = np.maximum.accumulate(ts)[:-1]
            late = ts[1:] < prev_max
            rows_out = int(late.sum())
            if rows_out and strict:
                first = int(np.flatnonzero(late)[0]) + 1
                probs.add(raw.rows[first], "timestamp",
                          f"{rows_out} rows out of timestamp order (first here: {int(ts[first])} after "
                          f"{int(prev_max[first - 1])}); strict mode requires sorted timestamps")
    probs.raise_if_any()

    n = ts.shape[0]
    offsets_ns = (ts - ts.min()) * ns
    hash_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(raw.hash_len, out=hash_offsets[1:])
    hash_values = raw.hash_vals
    order = None
    if rows_out:
        warnings.warn(f"{path}: {rows_out} rows out of timestamp order; rows were stable-sorted by "
                      "timestamp (whole rows move together)", TraceOrderWarning, stacklevel=2)
        order = np.argsort(ts, kind="stable")
        new_len = raw.hash_len[order]
        new_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(new_len, out=new_off[1:])
        gather = np.repeat(hash_offsets[:-1][order] - new_off[:-1], new_len) + np.arange(new_off[-1], dtype=np.int64)
        hash_values = hash_values[gather]
        hash_offsets = new_off

    def take(a: np.ndarray) -> np.ndarray:
        return _readonly(np.ascontiguousarray(a[order] if order is not None else a, dtype=np.int64))

    def take_list(lst: list | None) -> list | None:
        if lst is None:
            return None
        return [lst[i] for i in order] if order is not None else list(lst)

    return Trace(
        path=path,
        timestamp_ns=take(offsets_ns),
        input_length=take(raw.il),
        output_length=take(raw.ol),
        hash_offsets=_readonly(hash_offsets),
        hash_values=_readonly(np.ascontiguousarray(hash_values, dtype=np.int64)),
        block_size=bs,
        source_row=take(raw.rows),
        rows_out_of_order=rows_out,
        request_id=take_list(raw.optional.get("request_id")),
        session_id=take_list(raw.optional.get("session_id")),
        model=take_list(raw.optional.get("model")),
        priority=take_list(raw.optional.get("priority")),
        extra_body=take_list(raw.optional.get("extra_body")),
        metadata=raw.metadata,
    )


def write_parquet(trace: Trace, path: str | os.PathLike, *, time_unit: str = "ms", source: str = "",
                  license: str = "") -> None:  # noqa: A002 - the metadata key is "license"
    """Write ``trace`` as canonical Parquet (schema in ``traces/README.md``).

    Timestamps are written as integer offsets from the first arrival in ``time_unit`` (s/ms/us/ns);
    ``ValueError`` if an offset is not a whole number of that unit. Empty ``source``/``license``
    fall back to ``trace.metadata``. Rows groups of 65,536 rows, zstd compression. The file is
    written to a temporary name and renamed into place.
    """
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of {', '.join(TIME_UNITS)}, got {time_unit!r}")
    ns = TIME_UNITS[time_unit]
    ts = np.asarray(trace.timestamp_ns, dtype=np.int64)
    rem = ts % ns
    if rem.any():
        i = int(np.flatnonzero(rem)[0])
        raise ValueError(f"timestamp offset {int(ts[i])} ns (row {i + 1}) is not a whole number of "
                         f"{time_unit}; choose a finer time_unit")
    offsets = np.asarray(trace.hash_offsets, dtype=np.int64)
    values = pa.array(np.asarray(trace.hash_values, dtype=np.int64), type=pa.int64())
    if offsets[-1] <= np.iinfo(np.int32).max:
        hash_col = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)
    else:
        hash_col = pa.LargeListArray.from_arrays(pa.array(offsets), values)
    cols: dict[str, pa.Array] = {
        "timestamp": pa.array(ts // ns, type=pa.int64()),
        "input_length": pa.array(np.asarray(trace.input_length, dtype=np.int64), type=pa.int64()),
        "output_length": pa.array(np.asarray(trace.output_length, dtype=np.int64), type=pa.int64()),
        "hash_ids": hash_col,
    }
    for name in _OPTIONAL:
        lst = getattr(trace, name)
        if lst is not None:
            cols[name] = pa.array(lst, type=pa.int64() if name == "priority" else pa.string())
    meta = {
        "schema_version": SCHEMA_VERSION,
        "block_size": str(int(trace.block_size)),
        "time_unit": time_unit,
        "source": source or trace.metadata.get("source", ""),
        "license": license or trace.metadata.get("license", ""),
    }
    table = pa.table(cols).replace_schema_metadata({META_PREFIX + k: v for k, v in meta.items()})
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        pq.write_table(table, tmp, row_group_size=ROW_GROUP_SIZE, compression="zstd")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, fmt: str = "auto", block_size: int | None = None,
            source: str | None = None, license: str = "", first_seconds: float | None = None,  # noqa: A002
            strict: bool = False) -> Trace:
    """Read and validate ``src``, optionally keep rows with offset < ``first_seconds``, write ``dst``.

    ``dst`` is canonical Parquet with timestamps in the source's unit (ms for Mooncake JSONL).
    ``source`` ``None`` -> the source's own ``replayer.source`` or ``"converted from <file name>"``.
    Returns the trace that was written. Raises :class:`TraceError` (invalid input) or
    ``ValueError`` (bad ``first_seconds``, or no rows left after cutting).
    """
    src = os.fspath(src)
    if first_seconds is not None and not (
            isinstance(first_seconds, (int, float)) and not isinstance(first_seconds, bool)
            and math.isfinite(first_seconds) and first_seconds > 0):
        raise ValueError(f"first_seconds must be a positive number, got {first_seconds!r}")
    trace = read_trace(src, fmt=fmt, block_size=block_size, strict=strict)
    if first_seconds is not None:
        limit_ns = int(round(first_seconds * 1_000_000_000))
        n = int(np.searchsorted(trace.timestamp_ns, limit_ns, side="left"))
        if n == 0:
            raise ValueError(f"{src}: no rows in the first {first_seconds} s")
        trace = trace.head(n)
    if source is None:
        source = trace.metadata.get("source") or f"converted from {os.path.basename(src)}"
    unit = trace.metadata.get("time_unit", DEFAULT_TIME_UNIT)
    if unit not in TIME_UNITS:
        unit = DEFAULT_TIME_UNIT
    write_parquet(trace, dst, time_unit=unit, source=source, license=license)
    meta = dict(trace.metadata)
    meta.update(source=source, license=license or meta.get("license", ""), time_unit=unit,
                schema_version=SCHEMA_VERSION, block_size=str(trace.block_size))
    return dataclasses.replace(trace, path=os.fspath(dst), metadata=meta)
