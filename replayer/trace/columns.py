"""Raw columns in file order (``_Raw``): what every format reader returns before sorting.

Validation of an Arrow table's columns (canonical Parquet, CSV) into a ``_Raw``
(``_raw_from_table``), the integer and hash id column fast paths, CSV cell numbers, and the
hash id count check (``ceil(input_length / block_size)`` ids per row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from replayer.trace.images import check_image_rows
from replayer.trace.mapping import _Opts, _src, _synth_hash, map_hint
from replayer.trace.model import _OPTIONAL, _REQUIRED, TIME_UNITS, _Problems
from replayer.trace.optional_columns import _check_requests, _optional_column
from replayer.trace.timestamps import _timestamps
from replayer.trace.values import (
    _hash_from_lists,
    _hash_ids_from_strings,
    _hash_slow,
    _ints_checked,
    _ints_from_list,
    _ints_slow,
)

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
        assert self.shard_start is not None  # set with shard_files
        return self.shard_files[int(np.searchsorted(self.shard_start, i, side="right")) - 1]


def _column_ints(
    col: pa.ChunkedArray, rows: np.ndarray, field_: str, probs: _Problems
) -> tuple[np.ndarray, np.ndarray]:
    t = col.type
    if pa.types.is_integer(t) and col.null_count == 0:
        return _ints_checked(col.to_numpy(), rows, field_, probs)
    return _ints_slow(col.to_pylist(), rows, field_, probs)


def _column_hash(col: pa.ChunkedArray, rows: np.ndarray, probs: _Problems) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = col.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):  # CSV: a JSON list per cell
        lists: list = []
        for v in col.to_pylist():
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
                    vals = _hash_ids_from_strings(flat.to_pylist())
                    if vals is not None:
                        return lengths, vals.astype(np.int64), np.ones(len(arr), dtype=bool)
    return _hash_slow(col.to_pylist(), rows, probs)


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


def _raw_from_table(
    table: pa.Table,
    probs: _Problems,
    meta: dict[str, str],
    block_size: int,
    opts: _Opts,
    rows: np.ndarray,
    synth_start: int = 0,
) -> _Raw | None:
    """Validate the columns of ``table`` (Parquet or CSV) -> raw columns; ``rows`` numbers the rows."""
    text: dict[str, list] = {}
    if opts.fmt in ("csv", "azure"):  # a bad cell makes the whole CSV column text: re-read the numbers
        for name in (
            "timestamp",
            "input_length",
            "output_length",
            "priority",
            "turn",
            "query_length",
            "think_time_s",
            "num_images",
            "image_tokens",
        ):
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
            present = ", ".join(table.column_names) or "none"
            probs.add(
                0, c, f"missing required column{mapped} (columns present: {present}){map_hint(c, table.column_names)}"
            )
    if missing:
        return None
    if table.num_rows == 0:
        probs.add(0, "file", "no rows (empty trace)")
        return None
    unit = meta["time_unit"]
    ts, ts_ok, ns = _timestamps(
        text.get("timestamp") or table.column(_src(opts, "timestamp")), rows, unit, opts.allow_float_time, probs
    )
    if unit != "datetime" and ns != TIME_UNITS[unit]:
        meta["time_unit"] = next(u for u, v in TIME_UNITS.items() if v == ns)
    il, il_ok = (
        _ints_from_list(text["input_length"], rows, "input_length", probs)
        if "input_length" in text
        else _column_ints(table.column(_src(opts, "input_length")), rows, "input_length", probs)
    )
    ol, ol_ok = (
        _ints_from_list(text["output_length"], rows, "output_length", probs)
        if "output_length" in text
        else _column_ints(table.column(_src(opts, "output_length")), rows, "output_length", probs)
    )
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
    check_image_rows(rows, optional, probs)
    return _Raw(rows, ts, ts_ok, il, il_ok, ol, ol_ok, hl, hv, hok, optional, ns, block_size, meta)


def _check_hash_counts(raw: _Raw, probs: _Problems) -> None:
    """hash_ids count must match the prompt length (checked where both are valid)."""
    bs = raw.block_size
    both = raw.il_ok & raw.hash_ok
    expected = (raw.il + (bs - 1)) // bs
    wrong = both & (expected != raw.hash_len)
    for i in np.flatnonzero(wrong):
        e, a, L = int(expected[i]), int(raw.hash_len[i]), int(raw.il[i])
        probs.add(
            raw.rows[i],
            "hash_ids",
            f"expected {e} hash id{'s' if e != 1 else ''} (ceil(input_length {L} / block_size {bs})), got {a}",
        )
