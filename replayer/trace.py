"""Trace loading, validation and conversion.

A *trace* is a list of requests: when each one arrives, how many prompt tokens it has, how many
tokens it must generate, and which prompt blocks (``hash_ids``) it shares with other requests.

Formats (details in :func:`read_trace` and ``traces/README.md``): canonical Parquet (one file, a
folder or a glob of shards; streamed by :func:`open_trace`), Mooncake JSONL (FAST'25 release,
kvcache-ai/Mooncake ``FAST25-release/traces``), the Azure LLM inference trace CSV (Azure Public
Dataset AzureLLMInferenceTrace 2023; Splitwise, ISCA 2024) and generic JSONL / CSV / Parquet with
a column mapping and a time unit. Hash ids are 64-bit integers or strings
(:func:`hash_id_from_string`); sources without them get unique ids from :data:`SYNTH_ID_BASE`.

Canonical Parquet (``traces/README.md`` documents it exactly): columns ``timestamp``,
``input_length``, ``output_length`` (int64), ``hash_ids`` (list<int64> or list<uint64>), optional
``request_id``, ``session_id``, ``model`` (string), ``priority`` (int64), ``extra_body`` (string
holding a JSON object); optional session and endpoint columns ``turn`` (int64), ``parent_request_id``
(string), ``think_time_s`` (float64), ``endpoint`` (string, one of :data:`ENDPOINTS`),
``query_length`` (int64), ``document_lengths`` (list<int64>); file metadata
``replayer.schema_version``, ``replayer.block_size``, ``replayer.time_unit``, ``replayer.source``,
``replayer.license`` (and ``replayer.hash_ids`` = ``synthesised`` for synthesised hash ids).

``read_trace`` validates the whole file and raises one :class:`TraceError` that lists every problem
(file, 1-based row, field, message). Rows are then stable-sorted by timestamp as whole rows (a
timestamp never gets another row's lengths) and times become int64 nanosecond offsets from the
smallest timestamp.
"""

from __future__ import annotations

import dataclasses
import glob as _glob
import hashlib
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
    "trace_table",
    "slice_rows",
    "convert",
    "coarsest_unit",
    "SCHEMA_VERSION",
    "DEFAULT_BLOCK_SIZE",
    "TIME_UNITS",
    "FORMATS",
    "SYNTH_ID_BASE",
    "HASH_ID_KEY",
    "hash_id_from_string",
    "parse_mapping",
    "TraceSource",
    "open_trace",
    "trace_paths",
    "ENDPOINTS",
]

SCHEMA_VERSION = "1"
DEFAULT_BLOCK_SIZE = 512
DEFAULT_TIME_UNIT = "ms"
#: Nanoseconds per unit for ``replayer.time_unit``.
TIME_UNITS: dict[str, int] = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
META_PREFIX = "replayer."
MAX_PROBLEMS = 50
#: Input formats (``fmt=``); ``"auto"`` picks one from the path (see :func:`read_trace`).
FORMATS = ("parquet", "mooncake", "azure", "jsonl", "csv")
#: Time units accepted by ``time_unit=`` for the generic formats (``datetime``: ISO-8601 strings).
READ_TIME_UNITS = ("s", "ms", "us", "ns", "datetime")
#: Synthesised hash ids (rows of a trace without prefix information, e.g. the Azure trace) are
#: ``SYNTH_ID_BASE + k`` for the k-th block of the file (0-based, file order): the reserved range
#: [2**62, 2**63). Ids read from files should stay below 2**62 to never meet them.
SYNTH_ID_BASE = 1 << 62
#: Key of the blake2b hash that maps string hash ids to 64-bit ids (part of the format: never change).
HASH_ID_KEY = b"replayer.hash_id.v1"
_U64 = 1 << 64
_HEX = frozenset("0123456789abcdefABCDEF")
ROW_GROUP_SIZE = 65_536

#: Request endpoints a row may name (``endpoint`` column): short name -> API path. Either form is
#: accepted; rows store the path.
ENDPOINTS: dict[str, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "embeddings": "/v1/embeddings",
    "score": "/v1/score",
    "rerank": "/v1/rerank",
}
_ENDPOINT_PATH = {**ENDPOINTS, **{v: v for v in ENDPOINTS.values()}}
#: Endpoints whose rows must give ``query_length`` and ``document_lengths``.
_QUERY_ENDPOINTS = ("/v1/score", "/v1/rerank")

_INT64_MAX = int(np.iinfo(np.int64).max)
_REQUIRED = ("timestamp", "input_length", "output_length", "hash_ids")
#: Optional per-row columns -> the Arrow type ``write_parquet`` gives them. On a Trace each is a list
#: (None for a missing value) except ``think_time_s``, a float64 array (NaN for a missing value).
_OPTIONAL_TYPES: dict[str, pa.DataType] = {
    "request_id": pa.string(), "session_id": pa.string(), "model": pa.string(), "priority": pa.int64(),
    "extra_body": pa.string(), "turn": pa.int64(), "parent_request_id": pa.string(),
    "think_time_s": pa.float64(), "endpoint": pa.string(), "query_length": pa.int64(),
    "document_lengths": pa.list_(pa.int64()),
}
_OPTIONAL = tuple(_OPTIONAL_TYPES)
_FIELD_ORDER = {
    name: i
    for i, name in enumerate(
        ("file", "format", "metadata", "json", *_REQUIRED, *_OPTIONAL)
    )
}
_MIN = {"timestamp": 0, "input_length": 1, "output_length": 1, "turn": 0, "query_length": 1,
        "document_lengths": 1}


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

    def add(self, row: int, field_: str, message: str, file: str | None = None) -> None:
        self.items.append(TraceProblem(file or self.file, int(row), field_, message))

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
      ``hash_values[hash_offsets[i]:hash_offsets[i+1]]`` (Arrow ListArray layout) and row ``i`` has
      ``ceil(input_length[i] / block_size)`` of them. Ids are unsigned 64-bit values stored as their
      int64 bit pattern: an id >= 2**63 reads as ``id - 2**64`` (``int(h) & (2**64 - 1)`` recovers it;
      ``prompts`` masks the same way). Ids from integers in the file are < 2**63 in practice; string
      ids (:func:`hash_id_from_string`) may use all 64 bits.
    * ``source_row`` int64[n]: 1-based row number (JSONL: line number) of each row in the source.
    * ``rows_out_of_order``: rows whose timestamp is smaller than the largest timestamp before them.
    * Optional columns (``request_id``, ``session_id``, ``model``: ``str | None``; ``priority``:
      ``int | None``; ``extra_body``: ``str | None`` holding a JSON object) are lists in sorted
      order, or ``None`` when the source has no such column.
    * Session and endpoint columns (lists in sorted order, ``None`` when the source has no such
      column; ``traces/README.md`` has the rules): ``turn`` ``int | None`` (>= 0, turn number in
      its session); ``parent_request_id`` ``str | None`` (request this one follows; rows with one
      and no ``session_id`` get ``session_id`` = the chain's root request id);
      ``think_time_s``: float64[n] array of seconds (>= 0, NaN = not set) or ``None``;
      ``endpoint`` ``str | None``: an API path, a value of :data:`ENDPOINTS`; ``query_length``
      ``int | None`` (tokens, >= 1); ``document_lengths`` ``list[int] | None`` (tokens per
      document, each >= 1; with ``query_length`` they add up to ``input_length``).
    * ``hash_ids_synthetic``: the hash ids were synthesised (no prefix information in the source:
      Azure CSV, ``hash_ids=`` mapping); metadata ``hash_ids`` is then ``"synthesised"``.
    * ``metadata``: ``schema_version``, ``block_size``, ``time_unit`` (unit of the source's
      timestamps), ``source``, ``license``, ``format`` (one of :data:`FORMATS`), without the
      ``replayer.`` prefix.
    * ``row_offset``: index of row 0 in the whole trace (batches of :meth:`TraceSource.batches`).
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
    #: Index of this trace's first row in the whole trace (0 unless it is a batch of a TraceSource).
    row_offset: int = 0
    turn: list[int | None] | None = None
    parent_request_id: list[str | None] | None = None
    think_time_s: np.ndarray | None = None
    endpoint: list[str | None] | None = None
    query_length: list[int | None] | None = None
    document_lengths: list[list[int] | None] | None = None
    hash_ids_synthetic: bool = False

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
            metadata=dict(self.metadata),
            row_offset=self.row_offset,
            hash_ids_synthetic=self.hash_ids_synthetic,
            **_cut_optional(self, slice(0, n)),
        )


def _cut_optional(t: Trace, sel: slice | np.ndarray) -> dict[str, Any]:
    """The optional per-row columns of ``t`` at ``sel`` (a slice, or an int index array) by name."""
    out: dict[str, Any] = {}
    for name in _OPTIONAL:
        v = getattr(t, name)
        if v is None or isinstance(sel, slice) or isinstance(v, np.ndarray):
            out[name] = None if v is None else v[sel]
        else:
            out[name] = [v[i] for i in sel.tolist()]
    return out


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


def hash_id_from_string(s: str) -> int:
    """Map a string hash id to its unsigned 64-bit id (0 <= id < 2**64), the same everywhere.

    Exactly 16 hex digits (case-insensitive, no prefix) parse as their 64-bit value, so ids printed
    as hex round-trip; any other string -> the big-endian 8-byte keyed blake2b digest
    (``digest_size=8``, ``key=HASH_ID_KEY``) of its UTF-8 bytes. Never Python's salted ``hash()``,
    never cut to 32 bits. Raises ValueError for the empty string.
    """
    if not s:
        raise ValueError("empty string")
    if len(s) == 16 and _HEX.issuperset(s):
        return int(s, 16)
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8, key=HASH_ID_KEY).digest(), "big")


def _coerce_hash(v: Any) -> tuple[int | None, str | None]:
    """One hash id (int 0..2**64-1, integral float, or string) -> (int64 bit pattern, None) or (None, error)."""
    if isinstance(v, str):
        if not v:
            return None, "empty string is not a hash id"
        iv = hash_id_from_string(v)
    elif v is None:
        return None, "missing (null)"
    elif isinstance(v, bool):
        return None, f"expected an integer or string, got boolean {v!r}"
    elif isinstance(v, (int, np.integer)):
        iv = int(v)
    elif isinstance(v, (float, np.floating)):
        fv = float(v)
        if not math.isfinite(fv) or not fv.is_integer():
            return None, f"expected an integer, got non-integer {fv!r}"
        iv = int(fv)
    else:
        return None, f"expected an integer or string, got {_type_name(v)} {_short(v)}"
    if iv < 0:
        return None, _range_message("hash_ids", iv)
    if iv >= _U64:
        return None, f"value {iv} does not fit in 64 bits (int64/uint64)"
    return (iv - _U64 if iv > _INT64_MAX else iv), None


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
            iv, err = _coerce_hash(v)
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
        else:
            types = set(map(type, flat))
            if types == {int}:  # plain ints only (no bool, float, str, None)
                try:
                    vals = np.array(flat)
                except (ValueError, OverflowError, TypeError):
                    vals = None
            elif types == {str} and all(flat):
                vals = np.array([hash_id_from_string(x) for x in flat], dtype=np.uint64)
        if (vals is not None and vals.ndim == 1 and vals.dtype.kind in "iu"
                and (vals.size == 0 or vals.dtype.kind == "u" or vals.min() >= 0)):
            return lengths, vals.astype(np.int64, copy=False), np.ones(n, dtype=bool)
    return _hash_slow(lists, rows, probs)


def _is_nan(v: Any) -> bool:
    return isinstance(v, (float, np.floating)) and math.isnan(v)


def _no_parent(v: Any) -> bool:
    """A negative integer parent id (``-1``: "no parent" in some traces, e.g. Alibaba's) is no parent."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return v < 0
    return isinstance(v, str) and v[:1] == "-" and v[1:].isdigit()


def _document_lengths(v: Any) -> tuple[list[int] | None, str | None]:
    """One ``document_lengths`` value (a list, or a string holding a JSON list) -> (list, None) or (None, error)."""
    if isinstance(v, str):  # CSV cells (and JSONL strings) hold a JSON list
        try:
            v = orjson.loads(v)
        except orjson.JSONDecodeError:
            return None, f"expected a list of integers, got string {_short(v)}"
    if not isinstance(v, (list, tuple, np.ndarray)):
        return None, f"expected a list of integers, got {_type_name(v)} {_short(v)}"
    if len(v) == 0:
        return None, "empty list: expected at least one document length"
    out = []
    for j, x in enumerate(v):
        iv, err = _coerce_int(x, "document_lengths", 1)
        if err is not None:
            return None, f"document_lengths[{j}]: {err}"
        out.append(iv)
    return out, None


def _think_times(values: list | pa.ChunkedArray, rows: np.ndarray, probs: _Problems) -> np.ndarray:
    """``think_time_s`` -> float64 seconds, NaN where not set (null or NaN); < 0 or infinite is an error."""
    if isinstance(values, pa.ChunkedArray):
        t = values.type
        if pa.types.is_floating(t) or pa.types.is_integer(t):
            out = np.array(values.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
            bad = ~np.isnan(out) & ~((out >= 0) & np.isfinite(out))
            for i in np.flatnonzero(bad):
                probs.add(rows[i], "think_time_s", f"think_time_s {float(out[i])!r} is not allowed: "
                                                   "must be a finite number >= 0 (seconds)")
            out[bad] = np.nan
            return out
        values = values.to_pylist()
    out = np.full(len(values), np.nan, dtype=np.float64)
    for i, v in enumerate(values):
        if v is _MISSING or v is None or _is_nan(v):
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            probs.add(rows[i], "think_time_s", f"expected a number (seconds), got {_type_name(v)} {_short(v)}")
            continue
        fv = float(v)
        if not math.isfinite(fv) or fv < 0:
            probs.add(rows[i], "think_time_s", f"think_time_s {fv!r} is not allowed: must be a finite number "
                                               ">= 0 (seconds)")
            continue
        out[i] = fv
    return out


def _optional_column(name: str, values: list | pa.ChunkedArray, rows: np.ndarray,
                     probs: _Problems) -> list | np.ndarray:
    """Check one optional column -> list in file order (None = not set), or a float64 array for ``think_time_s``."""
    if name == "think_time_s":
        return _think_times(values, rows, probs)
    if isinstance(values, pa.ChunkedArray):
        values = values.to_pylist()
    return _optional_from_list(name, values, rows, probs)


def _optional_from_list(name: str, values: list, rows: np.ndarray, probs: _Problems) -> list:
    out: list = []
    for i, v in enumerate(values):
        if v is _MISSING or v is None:
            out.append(None)
            continue
        if name in ("request_id", "session_id", "parent_request_id"):
            if name == "parent_request_id" and _no_parent(v):
                out.append(None)
            elif isinstance(v, str):
                out.append(v)
            elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                out.append(str(int(v)))
            else:
                probs.add(rows[i], name, f"expected a string, got {_type_name(v)} {_short(v)}")
                out.append(None)
        elif name in ("turn", "query_length"):
            if _is_nan(v):  # a float column's NaN means "not set" (as null)
                out.append(None)
                continue
            iv, err = _coerce_int(v, name, _MIN[name])
            if err is not None:
                probs.add(rows[i], name, err)
            out.append(iv)
        elif name == "endpoint":
            path = _ENDPOINT_PATH.get(v) if isinstance(v, str) else None
            if path is None:
                probs.add(rows[i], name, f"unknown endpoint {_short(v)}: expected one of "
                                         f"{', '.join(ENDPOINTS.values())} or the short names "
                                         f"{', '.join(ENDPOINTS)}")
            out.append(path)
        elif name == "document_lengths":
            lst, err = _document_lengths(v)
            if err is not None:
                probs.add(rows[i], name, err)
            out.append(lst)
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


def _check_requests(rows: np.ndarray, il: np.ndarray, il_ok: np.ndarray, optional: dict[str, Any],
                    probs: _Problems) -> None:
    """Row rules of ``query_length`` / ``document_lengths`` / ``endpoint`` (values that parsed)."""
    q, d, e = (optional.get(k) for k in ("query_length", "document_lengths", "endpoint"))
    if q is None and d is None and e is None:
        return
    bad = {(p.row, p.field) for p in probs.items if p.field in ("query_length", "document_lengths")}
    for i in range(len(rows)):
        qi = q[i] if q is not None else None
        di = d[i] if d is not None else None
        ei = e[i] if e is not None else None
        r = int(rows[i])
        q_bad, d_bad = (r, "query_length") in bad, (r, "document_lengths") in bad
        if ei in _QUERY_ENDPOINTS:
            if qi is None and not q_bad:
                probs.add(r, "query_length", f"missing: endpoint {ei} needs query_length and document_lengths")
            if di is None and not d_bad:
                probs.add(r, "document_lengths", f"missing: endpoint {ei} needs query_length and document_lengths")
        elif qi is not None and di is None and not d_bad:
            probs.add(r, "document_lengths", "missing: required when query_length is set")
        if di is not None and not q_bad and il_ok[i]:
            docs = sum(di)
            if (qi or 0) + docs != int(il[i]):
                probs.add(r, "document_lengths",
                          f"query_length {qi or 0} + sum(document_lengths) {docs} = {(qi or 0) + docs} "
                          f"!= input_length {int(il[i])}: they must be equal")


# --------------------------------------------------------------------------------------------
# Reading options and column mapping


_ALL_FIELDS = (*_REQUIRED, *_OPTIONAL)
_AZURE_MAP = {"timestamp": "TIMESTAMP", "input_length": "ContextTokens", "output_length": "GeneratedTokens",
              "hash_ids": ""}


def parse_mapping(text: str | dict[str, str] | None) -> dict[str, str]:
    """``"timestamp=ts,input_length=prompt_len"`` -> ``{"timestamp": "ts", ...}`` (canonical -> source).

    Keys must be canonical field names (``timestamp``, ``input_length``, ``output_length``,
    ``hash_ids``, ``request_id``, ``session_id``, ``model``, ``priority``, ``extra_body``,
    ``turn``, ``parent_request_id``, ``think_time_s``, ``endpoint``, ``query_length``,
    ``document_lengths``); an empty value for ``hash_ids`` (``hash_ids=``) means "no prefix
    information: synthesise unique ids".
    Raises ValueError naming the bad entry.
    """
    if text is None:
        return {}
    items = text.items() if isinstance(text, dict) else (
        part.split("=", 1) if "=" in part else (part, None) for part in text.split(",") if part.strip())
    out: dict[str, str] = {}
    for k, v in items:
        k = k.strip()
        if v is None:
            raise ValueError(f"--map entry {k!r}: expected FIELD=COLUMN")
        if k not in _ALL_FIELDS:
            raise ValueError(f"--map entry {k!r}: not a trace field (one of {', '.join(_ALL_FIELDS)})")
        v = v.strip()
        if not v and k != "hash_ids":
            raise ValueError(f"--map entry {k!r}: empty column name (only hash_ids may be empty)")
        out[k] = v
    return out


@dataclass(frozen=True)
class _Opts:
    fmt: str  # resolved format, one of FORMATS
    block_size: int | None
    strict: bool
    mapping: dict[str, str]
    time_unit: str | None  # None: the format's default (Parquet: metadata)
    allow_float_time: bool


def _src(opts: _Opts, name: str) -> str:
    """Source column/key of canonical field ``name`` ('' = absent by request)."""
    return opts.mapping.get(name, name)


def _synth_hash(il: np.ndarray, il_ok: np.ndarray, bs: int, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique ids for rows without prefix information: block k of the file -> SYNTH_ID_BASE + start + k."""
    lengths = np.where(il_ok, (il + (bs - 1)) // bs, 0).astype(np.int64)
    vals = SYNTH_ID_BASE + start + np.arange(int(lengths.sum()), dtype=np.int64)
    return lengths, vals, il_ok.copy()


# --------------------------------------------------------------------------------------------
# Timestamps: integers in a unit, floats (generic formats), or date-time strings


def _parse_datetimes(arr: pa.Array) -> pa.Array | None:
    for typ in (pa.timestamp("ns"), pa.timestamp("ns", tz="UTC")):
        try:
            return arr.cast(typ).cast(pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return None


def _datetimes_slow(values: list, rows: np.ndarray, probs: _Problems) -> tuple[np.ndarray, np.ndarray]:
    out = np.zeros(len(values), dtype=np.int64)
    ok = np.ones(len(values), dtype=bool)
    for i, v in enumerate(values):
        if v is None or v is _MISSING:
            ok[i] = False
            probs.add(rows[i], "timestamp", "missing" if v is _MISSING else "missing (null)")
            continue
        if not isinstance(v, str):
            ok[i] = False
            probs.add(rows[i], "timestamp", f"expected a date-time string, got {_type_name(v)} {_short(v)}")
            continue
        got = _parse_datetimes(pa.array([v], pa.string()))
        if got is None:
            ok[i] = False
            probs.add(rows[i], "timestamp", f"not a date-time: {_short(v)} (expected e.g. 2023-11-16 18:15:46.6805900)")
        else:
            out[i] = got[0].as_py()
    return out, ok


def _timestamps(values: list | pa.ChunkedArray, rows: np.ndarray, unit: str, allow_float: bool,
                probs: _Problems) -> tuple[np.ndarray, np.ndarray, int]:
    """Timestamps of one source -> (int64 values, ok mask, ns per value unit)."""
    col = values if isinstance(values, pa.ChunkedArray) else None
    if unit == "datetime":
        if col is not None and (pa.types.is_timestamp(col.type)) and col.null_count == 0:
            return col.cast(pa.timestamp("ns")).cast(pa.int64()).to_numpy(), np.ones(len(col), bool), 1
        if col is not None and pa.types.is_string(col.type) and col.null_count == 0:
            got = _parse_datetimes(col.combine_chunks())
            if got is not None:
                return got.to_numpy(), np.ones(len(col), bool), 1
        vals = col.to_pylist() if col is not None else values
        if all(type(v) is str for v in vals):
            got = _parse_datetimes(pa.array(vals, pa.string()))
            if got is not None:
                return got.to_numpy(), np.ones(len(vals), bool), 1
        ts, ok = _datetimes_slow(vals, rows, probs)
        return ts, ok, 1
    ns = TIME_UNITS[unit]
    if col is not None:
        t = col.type
        if (pa.types.is_timestamp(t) or pa.types.is_duration(t)) and col.null_count == 0:
            ns = TIME_UNITS[t.unit]
            ts, ok = _ints_checked(col.cast(pa.int64()).to_numpy(), rows, "timestamp", probs)
            return ts, ok, ns
        if pa.types.is_floating(t) and allow_float and col.null_count == 0:
            f = col.to_numpy()
        elif pa.types.is_integer(t) and col.null_count == 0:
            ts, ok = _ints_checked(col.to_numpy(), rows, "timestamp", probs)
            return ts, ok, ns
        else:
            values = col.to_pylist()
            f = None
    else:
        f = None
    if f is None:
        kinds = set(map(type, values))
        if kinds == {int}:
            ts, ok = _ints_from_list(values, rows, "timestamp", probs)
            return ts, ok, ns
        if not (allow_float and kinds <= {int, float}):
            ts, ok = _ints_slow(values, rows, "timestamp", probs)
            return ts, ok, ns
        f = np.array(values, dtype=np.float64)
    # Fractional values in a coarse unit: convert to integer ns once, here.
    ok = np.isfinite(f) & (f >= 0) & (f * ns <= _INT64_MAX)
    for i in np.flatnonzero(~ok):
        v = float(f[i])
        probs.add(rows[i], "timestamp", "expected a number, got NaN" if math.isnan(v) else
                  (f"negative timestamp {v!r}: must be >= 0" if v < 0 else f"timestamp {v!r} {unit} does not fit in int64 ns"))
    return np.where(ok, np.round(np.where(ok, f, 0) * ns), 0).astype(np.int64), ok, 1


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
    optional: dict[str, Any]  # name -> list (or float64 array: think_time_s), file order
    ns_per_unit: int
    block_size: int
    metadata: dict[str, str]
    #: For multi-file sources: file of each shard and the raw index where each shard starts.
    shard_files: list[str] | None = None
    shard_start: np.ndarray | None = None

    def file_of(self, i: int) -> str | None:
        if self.shard_files is None:
            return None
        return self.shard_files[int(np.searchsorted(self.shard_start, i, side="right")) - 1]


def _read_jsonl(path: str, probs: _Problems, opts: _Opts) -> _Raw | None:
    """Mooncake / generic JSONL (or a JSON array): rows are physical line numbers (array: index+1)."""
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
    del data
    if not objs:
        if not probs:
            probs.add(0, "file", "no rows (empty trace)")
        return None
    rows_a = np.array(rows, dtype=np.int64)
    unit = opts.time_unit or DEFAULT_TIME_UNIT
    k = _src(opts, "timestamp")
    ts, ts_ok, ns = _timestamps([o.get(k, _MISSING) for o in objs], rows_a, unit, opts.allow_float_time, probs)
    cols = {}
    for name in ("input_length", "output_length"):
        k = _src(opts, name)
        cols[name] = _ints_from_list([o.get(k, _MISSING) for o in objs], rows_a, name, probs)
    bs = opts.block_size if opts.block_size is not None else DEFAULT_BLOCK_SIZE
    k = _src(opts, "hash_ids")
    if k:
        hl, hv, hok = _hash_from_lists([o.get(k, _MISSING) for o in objs], rows_a, probs)
    else:
        hl, hv, hok = _synth_hash(*cols["input_length"], bs, 0)
    optional: dict[str, Any] = {}
    for name in _OPTIONAL:
        k = _src(opts, name)
        if k and any(k in o for o in objs):
            optional[name] = _optional_column(name, [o.get(k, _MISSING) for o in objs], rows_a, probs)
    _check_requests(rows_a, *cols["input_length"], optional, probs)
    meta = {"format": opts.fmt, "time_unit": unit, "block_size": str(bs)}
    if not _src(opts, "hash_ids"):
        meta["hash_ids"] = "synthesised"
    return _Raw(rows_a, ts, ts_ok, *cols["input_length"], *cols["output_length"], hl, hv, hok,
                optional, ns, bs, meta)


def _column_ints(col: pa.ChunkedArray, rows: np.ndarray, field_: str, probs: _Problems) -> tuple[np.ndarray, np.ndarray]:
    t = col.type
    if pa.types.is_integer(t) and col.null_count == 0:
        return _ints_checked(col.to_numpy(), rows, field_, probs)
    return _ints_slow(col.to_pylist(), rows, field_, probs)


def _column_hash(col: pa.ChunkedArray, rows: np.ndarray, probs: _Problems) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = col.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):  # CSV: a JSON list per cell
        lists: list = []
        for i, v in enumerate(col.to_pylist()):
            if v is None:
                lists.append(None)
                continue
            try:
                lists.append(orjson.loads(v))
            except orjson.JSONDecodeError:
                lists.append(v)  # reported as "expected a list" with the text
        return _hash_from_lists(lists, rows, probs)
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) and col.null_count == 0:
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        vt = t.value_type
        if pa.types.is_integer(vt) or pa.types.is_string(vt) or pa.types.is_large_string(vt):
            lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
            flat = pc.list_flatten(arr)
            if flat.null_count == 0:
                if pa.types.is_integer(vt):
                    vals = flat.to_numpy(zero_copy_only=False)
                    if vals.size == 0 or vals.dtype.kind == "u" or vals.min() >= 0:
                        return lengths, vals.astype(np.int64, copy=False), np.ones(len(arr), dtype=bool)
                else:
                    strs = flat.to_pylist()
                    if all(strs):
                        vals = np.array([hash_id_from_string(x) for x in strs], dtype=np.uint64)
                        return lengths, vals.astype(np.int64), np.ones(len(arr), dtype=bool)
    return _hash_slow(col.to_pylist(), rows, probs)


def _parquet_meta(schema_meta: dict | None, probs: _Problems, opts: _Opts) -> tuple[dict[str, str], int]:
    meta: dict[str, str] = {"format": "parquet"}
    for k, v in (schema_meta or {}).items():
        ks = k.decode("utf-8", "replace")
        if ks.startswith(META_PREFIX):
            meta[ks[len(META_PREFIX):]] = v.decode("utf-8", "replace")
    ver = meta.get("schema_version", SCHEMA_VERSION)
    if ver != SCHEMA_VERSION:
        probs.add(0, "metadata", f"replayer.schema_version {ver!r} is not supported (expected {SCHEMA_VERSION!r})")
    if opts.time_unit is not None:
        meta["time_unit"] = opts.time_unit
    unit = meta.get("time_unit", DEFAULT_TIME_UNIT)
    if unit not in TIME_UNITS and unit != "datetime":
        probs.add(0, "metadata", f"replayer.time_unit {unit!r} is not one of s, ms, us, ns")
        unit = DEFAULT_TIME_UNIT
    meta["time_unit"] = unit
    block_size = opts.block_size
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
    return meta, block_size


def _num(v: Any) -> Any:
    """CSV cell text -> int / float when it is one, else unchanged (reported by the checks)."""
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return v
    return v


def _raw_from_table(table: pa.Table, probs: _Problems, meta: dict[str, str], block_size: int, opts: _Opts,
                    rows: np.ndarray, synth_start: int = 0) -> _Raw | None:
    """Validate the columns of ``table`` (Parquet or CSV) -> raw columns; ``rows`` numbers the rows."""
    text: dict[str, list] = {}
    if opts.fmt in ("csv", "azure"):  # a bad cell makes the whole CSV column text: re-read the numbers
        for name in ("timestamp", "input_length", "output_length", "priority", "turn", "query_length",
                     "think_time_s"):
            k = _src(opts, name)
            if k in table.column_names and (name != "timestamp" or meta["time_unit"] != "datetime"):
                col = table.column(k)
                if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                    text[name] = [_num(v) for v in col.to_pylist()]
    names = set(table.column_names)
    missing = []
    for c in _REQUIRED:
        k = _src(opts, c)
        if k and k not in names:
            missing.append(c)
            mapped = f" (mapped from {k!r})" if k != c else ""
            probs.add(0, c, f"missing required column{mapped} (columns present: "
                            f"{', '.join(table.column_names) or 'none'})")
    if missing:
        return None
    if table.num_rows == 0:
        probs.add(0, "file", "no rows (empty trace)")
        return None
    unit = meta["time_unit"]
    ts, ts_ok, ns = _timestamps(text.get("timestamp") or table.column(_src(opts, "timestamp")), rows, unit,
                                opts.allow_float_time, probs)
    if unit != "datetime" and ns != TIME_UNITS[unit]:
        meta["time_unit"] = next(u for u, v in TIME_UNITS.items() if v == ns)
    il, il_ok = (_ints_from_list(text["input_length"], rows, "input_length", probs) if "input_length" in text
                 else _column_ints(table.column(_src(opts, "input_length")), rows, "input_length", probs))
    ol, ol_ok = (_ints_from_list(text["output_length"], rows, "output_length", probs) if "output_length" in text
                 else _column_ints(table.column(_src(opts, "output_length")), rows, "output_length", probs))
    if _src(opts, "hash_ids"):
        hl, hv, hok = _column_hash(table.column(_src(opts, "hash_ids")), rows, probs)
    else:
        hl, hv, hok = _synth_hash(il, il_ok, block_size, synth_start)
        meta["hash_ids"] = "synthesised"
    optional: dict[str, Any] = {}
    for name in _OPTIONAL:
        k = _src(opts, name)
        if k and k in names:
            optional[name] = _optional_column(name, text[name] if name in text else table.column(k), rows, probs)
    _check_requests(rows, il, il_ok, optional, probs)
    return _Raw(rows, ts, ts_ok, il, il_ok, ol, ol_ok, hl, hv, hok, optional, ns, block_size, meta)


def trace_paths(path: str) -> list[str]:
    """Files of a Parquet source: the file itself, a folder's ``*.parquet``/``*.pq`` files, or a
    glob's matches, sorted by name (shards are read in that order as one trace). [] if none."""
    if os.path.isdir(path):
        return sorted(os.path.join(path, n) for n in os.listdir(path)
                      if n.endswith((".parquet", ".pq")) and not n.startswith((".", "_")))
    if any(c in path for c in "*?[") and not os.path.exists(path):
        return sorted(p for p in _glob.glob(path) if os.path.isfile(p))
    return [path]


def _concat_raw(raws: list[_Raw], files: list[str]) -> _Raw:
    if len(raws) == 1:
        return dataclasses.replace(raws[0], shard_files=files, shard_start=np.zeros(1, dtype=np.int64))
    cat = np.concatenate
    optional: dict[str, Any] = {}
    for name in _OPTIONAL:
        if name == "think_time_s" and any(name in r.optional for r in raws):
            optional[name] = cat([r.optional.get(name, np.full(len(r.rows), np.nan)) for r in raws])
        elif any(name in r.optional for r in raws):
            optional[name] = [v for r in raws for v in r.optional.get(name, [None] * len(r.rows))]
    r0 = raws[0]
    start = np.cumsum([0] + [len(r.rows) for r in raws[:-1]]).astype(np.int64)
    return _Raw(cat([r.rows for r in raws]), cat([r.ts for r in raws]), cat([r.ts_ok for r in raws]),
                cat([r.il for r in raws]), cat([r.il_ok for r in raws]), cat([r.ol for r in raws]),
                cat([r.ol_ok for r in raws]), cat([r.hash_len for r in raws]), cat([r.hash_vals for r in raws]),
                cat([r.hash_ok for r in raws]), optional, r0.ns_per_unit, r0.block_size, r0.metadata,
                shard_files=files, shard_start=start)


def _read_parquet(path: str, probs: _Problems, opts: _Opts) -> _Raw | None:
    files = trace_paths(path)
    if not files:
        probs.add(0, "file", "no Parquet files match (folder or glob is empty)")
        return None
    if len(files) == 1 and not os.path.exists(files[0]):
        probs.add(0, "file", "no such file")
        return None
    raws: list[_Raw] = []
    synth = 0
    units = set()
    for f in files:
        fp = _Problems(f)
        try:
            table = pq.read_table(f)
        except (pa.ArrowException, OSError, ValueError) as e:
            probs.add(0, "file", f"not a readable Parquet file: {e}", file=f)
            continue
        meta, bs = _parquet_meta(table.schema.metadata, fp, opts)
        raw = _raw_from_table(table, fp, meta, bs, opts, np.arange(1, table.num_rows + 1, dtype=np.int64), synth)
        del table
        if raw is not None:
            _check_hash_counts(raw, fp)
        probs.items.extend(fp.items)
        if raw is not None:
            synth += int(raw.hash_len.sum()) if raw.metadata.get("hash_ids") == "synthesised" else 0
            units.add(raw.ns_per_unit)
            raws.append(raw)
    if probs or len(raws) != len(files):
        return None
    if len(units) > 1:
        probs.add(0, "metadata", "shards disagree on replayer.time_unit; convert them one by one first")
        return None
    return _concat_raw(raws, files)


def _sniff_csv_header(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            first = f.readline(65536).decode("utf-8", "replace").strip()
    except OSError:
        return []
    return [c.strip().strip('"') for c in first.split(",")]


def _read_csv(path: str, probs: _Problems, opts: _Opts) -> _Raw | None:
    """Azure LLM inference trace CSV or generic CSV (header row; rows are line numbers, header = 1)."""
    import pyarrow.csv as pcsv

    types = {}
    unit = opts.time_unit or ("datetime" if opts.fmt == "azure" else DEFAULT_TIME_UNIT)
    if unit == "datetime":
        types[_src(opts, "timestamp")] = pa.string()
    for name in ("hash_ids", "request_id", "session_id", "model", "extra_body", "parent_request_id", "endpoint",
                 "document_lengths"):
        if _src(opts, name):
            types[_src(opts, name)] = pa.string()
    try:
        table = pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(column_types=types,
                                                                       strings_can_be_null=True))
    except (pa.ArrowException, OSError, ValueError) as e:
        probs.add(0, "file", f"not a readable CSV file: {e}")
        return None
    bs = opts.block_size if opts.block_size is not None else DEFAULT_BLOCK_SIZE
    meta = {"format": opts.fmt, "time_unit": unit, "block_size": str(bs)}
    if opts.fmt == "azure":
        meta["source"] = ("Azure LLM inference trace 2023 (AzurePublicDataset AzureLLMInferenceTrace; "
                          "Splitwise, ISCA 2024): " + os.path.basename(path))
        meta["license"] = "CC-BY-4.0"
    return _raw_from_table(table, probs, meta, bs, opts, np.arange(2, table.num_rows + 2, dtype=np.int64))


# --------------------------------------------------------------------------------------------
# Public API


def _resolve(path: str, fmt: str, block_size: int | None, strict: bool, mapping, time_unit: str | None,
             probs: _Problems) -> _Opts | None:
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1):
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if time_unit is not None and time_unit not in READ_TIME_UNITS:
        raise ValueError(f"time_unit must be one of {', '.join(READ_TIME_UNITS)}, got {time_unit!r}")
    mapping = parse_mapping(mapping)
    kind = fmt
    if fmt == "auto":
        ext = os.path.splitext(path)[1].lower()
        if os.path.isdir(path) or ext in (".parquet", ".pq") or (any(c in path for c in "*?[") and not os.path.exists(path)):
            kind = "parquet"
        elif ext in (".jsonl", ".json"):
            kind = "jsonl" if (mapping or time_unit) else "mooncake"
        elif ext == ".csv":
            head = set(_sniff_csv_header(path))
            kind = "azure" if (not mapping and {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= head) else "csv"
        else:
            probs.add(0, "format", f"unknown trace format for extension {ext or '(none)'!r}: expected "
                                   ".parquet/.pq or a folder/glob of them (canonical), .jsonl/.json "
                                   "(Mooncake or generic JSONL) or .csv (Azure or generic CSV); "
                                   "or name the format explicitly")
            return None
    elif fmt not in FORMATS:
        probs.add(0, "format", f"unknown trace format {fmt!r}: expected 'auto' or one of {', '.join(FORMATS)}")
        return None
    if kind == "azure":
        mapping = {**_AZURE_MAP, **mapping}
    if kind == "mooncake" and time_unit not in (None, "ms"):
        kind = "jsonl"
    allow_float = kind in ("jsonl", "csv", "azure") or time_unit is not None
    return _Opts(kind, block_size, strict, mapping, time_unit, allow_float)


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _check_hash_counts(raw: _Raw, probs: _Problems) -> None:
    """hash_ids count must match the prompt length (checked where both are valid)."""
    bs = raw.block_size
    both = raw.il_ok & raw.hash_ok
    expected = (raw.il + (bs - 1)) // bs
    wrong = both & (expected != raw.hash_len)
    for i in np.flatnonzero(wrong):
        e, a, L = int(expected[i]), int(raw.hash_len[i]), int(raw.il[i])
        probs.add(raw.rows[i], "hash_ids",
                  f"expected {e} hash id{'s' if e != 1 else ''} (ceil(input_length {L} / block_size {bs})), got {a}")


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
    for i in (order.tolist() if order is not None else range(len(sess))):
        s, t = sess[i], turns[i]
        if s is None or t is None or (parent is not None and parent[i] is not None):
            continue
        row = int(raw.rows[i])
        prev = last.get(s)
        if prev is not None and t <= prev[0]:
            probs.add(row, "turn", f"turn {t} of session {s!r} does not follow turn {prev[0]} (row {prev[1]}): "
                                   "turns of a session must strictly increase in time order", file=raw.file_of(i))
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


def _finish(raw: _Raw, probs: _Problems, path: str, strict: bool, *, origin: int | None = None,
            not_before: int | None = None, row_offset: int = 0, stacklevel: int = 3,
            sessions: _Sessions | None = None) -> Trace:
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
        tmin = int(ts.min()) if origin is None else int(origin)
        if not_before is not None and int(ts.min()) < not_before:
            i = int(np.flatnonzero(ts < not_before)[0])
            probs.add(raw.rows[i], "timestamp",
                      f"timestamp {int(ts[i])} goes back in time: an earlier row group reached {not_before}; "
                      "this Parquet source is not sorted - run `replayer trace convert` (which sorts) first",
                      file=raw.file_of(i))
        span_limit = _INT64_MAX // ns
        too_far = (ts - tmin) > span_limit
        for i in np.flatnonzero(too_far):
            probs.add(raw.rows[i], "timestamp", f"timestamp {int(ts[i])} is too far from the first "
                                                 f"({tmin}) to fit in int64 nanoseconds", file=raw.file_of(i))
        if ts.shape[0] > 1:
            prev_max = np.maximum.accumulate(ts)[:-1]
            late = ts[1:] < prev_max
            rows_out = int(late.sum())
            if rows_out and strict:
                first = int(np.flatnonzero(late)[0]) + 1
                probs.add(raw.rows[first], "timestamp",
                          f"{rows_out} rows out of timestamp order (first here: {int(ts[first])} after "
                          f"{int(prev_max[first - 1])}); strict mode requires sorted timestamps",
                          file=raw.file_of(first))
        order = np.argsort(ts, kind="stable") if rows_out else None
        _check_turns(raw, order, probs, sessions)
    probs.raise_if_any()

    n = ts.shape[0]
    offsets_ns = (ts - (ts.min() if origin is None else origin)) * ns
    hash_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(raw.hash_len, out=hash_offsets[1:])
    hash_values = raw.hash_vals
    if rows_out:
        warnings.warn(f"{path}: {rows_out} rows out of timestamp order; rows were stable-sorted by "
                      "timestamp (whole rows move together)", TraceOrderWarning, stacklevel=stacklevel)
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

    opt = {name: take_list(raw.optional.get(name)) for name in _OPTIONAL if name != "think_time_s"}
    think = raw.optional.get("think_time_s")
    if think is not None:
        think = _readonly(np.ascontiguousarray(think[order] if order is not None else think, dtype=np.float64))
    if opt["parent_request_id"] is not None:
        opt["session_id"] = _derive_sessions(opt["session_id"], opt["request_id"], opt["parent_request_id"],
                                             sessions.roots)
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


_READERS = {"parquet": _read_parquet, "mooncake": _read_jsonl, "jsonl": _read_jsonl, "csv": _read_csv,
            "azure": _read_csv}


def read_trace(path: str | os.PathLike, *, fmt: str = "auto", block_size: int | None = None,
               strict: bool = False, mapping: str | dict[str, str] | None = None,
               time_unit: str | None = None) -> Trace:
    """Read and validate a whole trace; return its rows stable-sorted by timestamp.

    ``path``: a file, or (Parquet) a folder of ``*.parquet`` shards or a glob; shards are read in
    name order as one trace. ``fmt``: ``"auto"`` (by extension: ``.parquet``/``.pq``/folder/glob
    -> ``parquet``; ``.jsonl``/``.json`` -> ``mooncake``, or ``jsonl`` when a mapping or time unit
    is given; ``.csv`` -> ``azure`` when the header has ``TIMESTAMP,ContextTokens,GeneratedTokens``,
    else ``csv``) or one of :data:`FORMATS`:

    * ``parquet``: canonical Parquet (``traces/README.md``); time unit from ``replayer.time_unit``.
    * ``mooncake``: Mooncake FAST'25 trace release JSONL (kvcache-ai/Mooncake
      ``FAST25-release/traces``): integer ms ``timestamp``, ``input_length``, ``output_length``,
      ``hash_ids`` (block 512).
    * ``azure``: Azure Public Dataset AzureLLMInferenceTrace 2023 CSV (Splitwise, ISCA 2024):
      ``TIMESTAMP`` (date-time, 7 fractional digits, no zone), ``ContextTokens``,
      ``GeneratedTokens``. No prefix information: row blocks get unique ids from
      :data:`SYNTH_ID_BASE` (k-th block of the file, in file order).
    * ``jsonl`` / ``csv``: generic files; ``mapping`` names the source column of each field
      (:func:`parse_mapping`; ``hash_ids=`` empty -> synthesised unique ids); ``time_unit`` is one
      of ``s``, ``ms`` (default), ``us``, ``ns`` (numbers, fractions allowed) or ``datetime``
      (ISO-8601 strings; offsets from the first). CSV ``hash_ids`` cells hold a JSON list.

    Hash ids may be integers (0 <= id < 2**64) or strings (:func:`hash_id_from_string`).
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

    Session columns (rules in ``traces/README.md``): a row with ``parent_request_id`` and no
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
    raw = _READERS[opts.fmt](path, probs, opts)
    if raw is None:
        probs.raise_if_any()
        raise TraceError([TraceProblem(path, 0, "file", "no rows (empty trace)")])  # pragma: no cover
    return _finish(raw, probs, path, strict)


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

    def _iter(self, max_rows: int, problems: list | None):
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        t = self.trace
        for start in range(0, len(t), max_rows):
            yield slice_rows(t, start, min(len(t), start + max_rows))


def slice_rows(t: Trace, a: int, b: int) -> Trace:
    """Rows ``a:b`` of ``t`` as a Trace sharing its arrays (``row_offset`` advanced by ``a``)."""
    ha, hb = int(t.hash_offsets[a]), int(t.hash_offsets[b])
    return Trace(path=t.path, timestamp_ns=t.timestamp_ns[a:b], input_length=t.input_length[a:b],
                 output_length=t.output_length[a:b], hash_offsets=_readonly(t.hash_offsets[a:b + 1] - ha),
                 hash_values=t.hash_values[ha:hb], block_size=t.block_size, source_row=t.source_row[a:b],
                 rows_out_of_order=t.rows_out_of_order if a == 0 else 0, metadata=t.metadata,
                 row_offset=t.row_offset + a, hash_ids_synthetic=t.hash_ids_synthetic,
                 **_cut_optional(t, slice(a, b)))


class _ParquetSource(TraceSource):
    """Canonical Parquet file / folder / glob, streamed with ``ParquetFile.iter_batches``.

    Rows must already be in time order across batches (``trace convert`` writes them so); a batch
    that goes back in time raises TraceError. Rows out of order *within* one batch are stable-sorted
    there (warning; an error with ``strict``), which equals the global sort.
    """

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
        self.num_rows = rows
        self.metadata = meta0
        self.block_size = bs

    def batches(self, max_rows: int = 65_536):
        return self._iter(max_rows, None)

    def _iter(self, max_rows: int, problems: list | None):
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
                problems.extend(fp.items)
                continue
            row = 1
            for rb in pf.iter_batches(batch_size=max_rows):
                table = pa.Table.from_batches([rb])
                n = table.num_rows
                bp = _Problems(f)
                raw = _raw_from_table(table, bp, dict(meta), bs, self.opts,
                                      np.arange(row, row + n, dtype=np.int64), synth)
                del table, rb
                row += n
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
                    batch = _finish(raw, bp, self.path, self.opts.strict, origin=origin,
                                    not_before=prev_max, row_offset=offset, stacklevel=4, sessions=sessions)
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


def open_trace(path: str | os.PathLike, *, fmt: str = "auto", block_size: int | None = None,
               strict: bool = False, mapping: str | dict[str, str] | None = None,
               time_unit: str | None = None) -> TraceSource:
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
    if opts.fmt == "parquet":
        files = trace_paths(path)
        if not files:
            raise TraceError([TraceProblem(path, 0, "file", "no Parquet files match (folder or glob is empty)")])
        if len(files) == 1 and not os.path.exists(files[0]):
            raise TraceError([TraceProblem(path, 0, "file", "no such file")])
        return _ParquetSource(path, files, opts)
    return _LoadedSource(read_trace(path, fmt=opts.fmt, block_size=block_size, strict=strict,
                                    mapping=mapping, time_unit=time_unit))


def trace_table(trace: Trace, *, time_unit: str = "ms", source: str = "", license: str = "",  # noqa: A002
                extra_metadata: dict[str, str] | None = None) -> pa.Table:
    """``trace`` as a canonical Arrow table with ``replayer.*`` schema metadata (see :func:`write_parquet`).

    Timestamps become integer offsets in ``time_unit`` (s/ms/us/ns); ``ValueError`` if an offset is
    not a whole number of that unit. ``hash_ids`` is list<int64>, or list<uint64> when some id is
    >= 2**63 (64 bits are kept). Empty ``source``/``license`` fall back to ``trace.metadata``.
    Optional columns are written only when the trace has them (``think_time_s`` NaN -> null);
    ``replayer.hash_ids`` = ``synthesised`` when ``trace.hash_ids_synthetic``.
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
    offsets = offsets - offsets[0]
    hv = np.asarray(trace.hash_values, dtype=np.int64)
    if hv.size and hv.min() < 0:  # ids >= 2**63 (string ids): keep all 64 bits as uint64
        values = pa.array(hv.view(np.uint64), type=pa.uint64())
    else:
        values = pa.array(hv, type=pa.int64())
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
    for name, typ in _OPTIONAL_TYPES.items():
        lst = getattr(trace, name)
        if lst is None:
            continue
        if name == "think_time_s":  # NaN (not set) -> null
            cols[name] = pa.array(np.asarray(lst, dtype=np.float64), type=typ, from_pandas=True)
        else:
            cols[name] = pa.array(lst, type=typ)
    meta = {
        "schema_version": SCHEMA_VERSION,
        "block_size": str(int(trace.block_size)),
        "time_unit": time_unit,
        "source": source or trace.metadata.get("source", ""),
        "license": license or trace.metadata.get("license", ""),
    }
    if trace.hash_ids_synthetic:
        meta["hash_ids"] = "synthesised"
    meta.update(extra_metadata or {})
    return pa.table(cols).replace_schema_metadata({META_PREFIX + k: v for k, v in meta.items()})


def write_parquet(trace: Trace, path: str | os.PathLike, *, time_unit: str = "ms", source: str = "",
                  license: str = "") -> None:  # noqa: A002 - the metadata key is "license"
    """Write ``trace`` as canonical Parquet (schema in ``traces/README.md``; table as :func:`trace_table`).

    Row groups of 65,536 rows, zstd compression. The file is written to a temporary name and
    renamed into place. ``ValueError`` if an offset is not a whole number of ``time_unit``.
    """
    table = trace_table(trace, time_unit=time_unit, source=source, license=license)
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        pq.write_table(table, tmp, row_group_size=ROW_GROUP_SIZE, compression="zstd")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def coarsest_unit(timestamp_ns: np.ndarray) -> str:
    """The coarsest of s, ms, us, ns that holds every offset in ``timestamp_ns`` exactly."""
    ts = np.asarray(timestamp_ns, dtype=np.int64)
    for unit in ("s", "ms", "us"):
        if not (ts % TIME_UNITS[unit]).any():
            return unit
    return "ns"


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, fmt: str = "auto", block_size: int | None = None,
            source: str | None = None, license: str = "", first_seconds: float | None = None,  # noqa: A002
            strict: bool = False, mapping: str | dict[str, str] | None = None,
            time_unit: str | None = None) -> Trace:
    """Read and validate ``src``, optionally keep rows with offset < ``first_seconds``, write ``dst``.

    Reads any format :func:`read_trace` reads (``fmt``, ``mapping``, ``time_unit`` as there).
    ``dst`` is canonical Parquet with timestamps in the source's unit (ms for Mooncake JSONL), or
    the coarsest unit that holds them exactly (date-time and fractional sources).
    ``source`` ``None`` -> the source's own ``replayer.source`` or ``"converted from <file name>"``.
    Returns the trace that was written. Raises :class:`TraceError` (invalid input) or
    ``ValueError`` (bad ``first_seconds``, or no rows left after cutting).
    """
    src = os.fspath(src)
    if first_seconds is not None and not (
            isinstance(first_seconds, (int, float)) and not isinstance(first_seconds, bool)
            and math.isfinite(first_seconds) and first_seconds > 0):
        raise ValueError(f"first_seconds must be a positive number, got {first_seconds!r}")
    trace = read_trace(src, fmt=fmt, block_size=block_size, strict=strict, mapping=mapping, time_unit=time_unit)
    if first_seconds is not None:
        limit_ns = int(round(first_seconds * 1_000_000_000))
        n = int(np.searchsorted(trace.timestamp_ns, limit_ns, side="left"))
        if n == 0:
            raise ValueError(f"{src}: no rows in the first {first_seconds} s")
        trace = trace.head(n)
    if source is None:
        source = trace.metadata.get("source") or f"converted from {os.path.basename(src)}"
    unit = trace.metadata.get("time_unit", DEFAULT_TIME_UNIT)
    if unit not in TIME_UNITS or (trace.timestamp_ns % TIME_UNITS[unit]).any():
        unit = coarsest_unit(trace.timestamp_ns)
    write_parquet(trace, dst, time_unit=unit, source=source, license=license)
    meta = dict(trace.metadata)
    meta.update(source=source, license=license or meta.get("license", ""), time_unit=unit,
                schema_version=SCHEMA_VERSION, block_size=str(trace.block_size))
    return dataclasses.replace(trace, path=os.fspath(dst), metadata=meta)
