"""The trace model: format constants, problems and errors, and the :class:`Trace` record.

Constants of the canonical format (schema version, time units, formats, endpoints, the hash id
ranges and key), the per-row column sets shared by readers and writers, :class:`TraceProblem`,
:class:`TraceError`, :class:`TraceOrderWarning`, the problem collector ``_Problems``, the
:class:`Trace` dataclass and the helpers that cut its columns (``_cut_optional``, ``_readonly``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from replayer.core import endpoints

SCHEMA_VERSION = "1"
DEFAULT_BLOCK_SIZE = 512
DEFAULT_TIME_UNIT = "ms"
#: Nanoseconds per unit for ``replayer.time_unit``.
TIME_UNITS: dict[str, int] = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
META_PREFIX = "replayer."
#: File metadata key that marks a capture's files (``replayer record``, ``trace from-log``): rows in
#: completion order, some not replayable (see ``trace/parquet.replayable_rows``)
CAPTURE_META = "replayer.capture"
#: A capture folder's rolled files list the parts they hold under this key (as results folders do)
ROLLED_PARTS_META = "replayer.rolled_parts"
MAX_PROBLEMS = 50
#: Input formats (``fmt=``); ``"auto"`` picks one from the path (see :func:`read_trace`).
FORMATS = ("parquet", "mooncake", "azure", "jsonl", "csv", "weka", "copilot", "tracelab", "servegen")
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
#: accepted; rows store the path (the one table: ``replayer.core.endpoints``).
ENDPOINTS: dict[str, str] = endpoints.NAMES
_ENDPOINT_PATH = {**ENDPOINTS, **{v: v for v in ENDPOINTS.values()}}
#: Endpoints whose rows must give ``query_length`` and ``document_lengths``.
_QUERY_ENDPOINTS = tuple(e.path for e in endpoints.TABLE if e.query)
#: Request body keys an ``extra_body`` may not set: the replayer sets them per request from the
#: row (the prompt of each endpoint, the output length) or needs them to measure (streaming with
#: usage). Every other top-level key is merged over the built body (``replayer.payload.body``).
EXTRA_BODY_RESERVED = frozenset(
    (
        "prompt",
        "messages",
        "input",
        "text_1",
        "text_2",
        "query",
        "documents",
        "max_tokens",
        "max_completion_tokens",
        "min_tokens",
        "stream",
        "stream_options",
    )
)

_INT64_MAX = int(np.iinfo(np.int64).max)
_REQUIRED = ("timestamp", "input_length", "output_length", "hash_ids")
#: Optional per-row columns -> the Arrow type ``write_parquet`` gives them. On a Trace each is a list
#: (None for a missing value) except ``think_time_s``, a float64 array (NaN for a missing value).
_OPTIONAL_TYPES: dict[str, pa.DataType] = {
    "request_id": pa.string(),
    "session_id": pa.string(),
    "model": pa.string(),
    "priority": pa.int64(),
    "extra_body": pa.string(),
    "turn": pa.int64(),
    "parent_request_id": pa.string(),
    "think_time_s": pa.float64(),
    "endpoint": pa.string(),
    "query_length": pa.int64(),
    "document_lengths": pa.list_(pa.int64()),
    "tenant": pa.string(),
    "image_ids": pa.list_(pa.string()),
    "image_sizes": pa.list_(pa.string()),
    "num_images": pa.int64(),
    "image_tokens": pa.int64(),
}
_OPTIONAL = tuple(_OPTIONAL_TYPES)
_FIELD_ORDER = {name: i for i, name in enumerate(("file", "format", "metadata", "json", *_REQUIRED, *_OPTIONAL))}
_MIN = {"timestamp": 0, "input_length": 1, "output_length": 1, "turn": 0, "query_length": 1, "document_lengths": 1}


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


class TraceUnitWarning(UserWarning):
    """A generic trace's timestamps, read in the default unit (ms), look like another (seconds)."""


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
      column; ``docs/reference/trace-formats.md`` has the rules): ``turn`` ``int | None`` (>= 0, turn number in
      its session); ``parent_request_id`` ``str | None`` (request this one follows; rows with one
      and no ``session_id`` get ``session_id`` = the chain's root request id);
      ``think_time_s``: float64[n] array of seconds (>= 0, NaN = not set) or ``None``;
      ``endpoint`` ``str | None``: an API path, a value of :data:`ENDPOINTS`; ``query_length``
      ``int | None`` (tokens, >= 1); ``document_lengths`` ``list[int] | None`` (tokens per
      document, each >= 1; with ``query_length`` they add up to ``input_length``).
    * ``tenant`` ``str | None``: the tenant of each row (the trace it came from in a mix).
    * Image columns (``trace.images``): ``image_ids`` ``list[str] | None`` (equal ids = the same
      image), ``image_sizes`` ``list[str] | None`` (``"WxH"`` per image), ``num_images``
      ``int | None`` (a count only: each image a new one), ``image_tokens`` ``int | None``
      (expected image tokens of the row's images together).
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
    #: the tenant (trace of a mix, ``replayer.trace.mix``) of each row, or None
    tenant: list[str | None] | None = None
    image_ids: list[list[str] | None] | None = None
    image_sizes: list[list[str] | None] | None = None
    num_images: list[int | None] | None = None
    image_tokens: list[int | None] | None = None

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


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a
