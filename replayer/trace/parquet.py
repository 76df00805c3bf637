"""Reader of canonical Parquet: one file, a folder or a glob of shards -> ``_Raw``.

``replayer.*`` file metadata (``_parquet_meta``), the shard list (:func:`trace_paths`) and the
concatenation of shards read one by one (problems name the shard).
"""

from __future__ import annotations

import dataclasses
import glob as _glob
import json
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replayer.trace.columns import _check_hash_counts, _Raw, _raw_from_table
from replayer.trace.mapping import _Opts
from replayer.trace.model import (
    _OPTIONAL,
    CAPTURE_META,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_TIME_UNIT,
    META_PREFIX,
    ROLLED_PARTS_META,
    SCHEMA_VERSION,
    TIME_UNITS,
    _Problems,
)


def _parquet_meta(schema_meta: dict | None, probs: _Problems, opts: _Opts) -> tuple[dict[str, str], int]:
    meta: dict[str, str] = {"format": "parquet"}
    for k, v in (schema_meta or {}).items():
        ks = k.decode("utf-8", "replace")
        if ks.startswith(META_PREFIX):
            meta[ks[len(META_PREFIX) :]] = v.decode("utf-8", "replace")
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


def trace_paths(path: str) -> list[str]:
    """Files of a Parquet source: the file itself, a folder's ``*.parquet``/``*.pq`` files, or a
    glob's matches, sorted by name (shards are read in that order as one trace). [] if none."""
    if os.path.isdir(path):
        files = sorted(
            os.path.join(path, n)
            for n in os.listdir(path)
            if n.endswith((".parquet", ".pq")) and not n.startswith((".", "_"))
        )
        return files + _unrolled_parts(path, files)
    if any(c in path for c in "*?[") and not os.path.exists(path):
        return sorted(p for p in _glob.glob(path) if os.path.isfile(p))
    return [path]


def _unrolled_parts(folder: str, files: list[str]) -> list[str]:
    """A capture folder's ``parts/part-*.parquet`` that no file of ``files`` lists in its
    ``replayer.rolled_parts`` (rows of a capture still running, or killed before its last roll)."""
    parts = sorted(_glob.glob(os.path.join(folder, "parts", "part-*.parquet")))
    if not parts:
        return []
    covered: set[str] = set()
    for f in files:
        try:
            names = (pq.read_schema(f).metadata or {}).get(ROLLED_PARTS_META.encode())
        except (OSError, pa.ArrowException):
            continue
        if names:
            covered.update(json.loads(names))
    return [p for p in parts if os.path.basename(p) not in covered]


def is_capture_folder(path: str) -> bool:
    """A folder written by ``replayer record`` (its ``capture.json``)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "capture.json"))


def replayable_rows(table: pa.Table, first_row: int = 1) -> tuple[pa.Table, np.ndarray]:
    """``table`` and the 1-based row numbers of its rows (``first_row`` = the number of its first).
    A capture file (metadata ``replayer.capture``) also holds requests that cannot be replayed:
    those with an unknown input length, no output or no hash ids (the upstream was down, the client
    left before any token); they are left out, the others keep their row numbers."""
    rows = np.arange(first_row, first_row + table.num_rows, dtype=np.int64)
    if CAPTURE_META.encode() not in (table.schema.metadata or {}):
        return table, rows
    names = table.column_names
    if not {"input_length", "output_length", "hash_ids"} <= set(names):
        return table, rows
    ok = pc.and_(
        pc.and_(pc.greater_equal(table.column("input_length"), 1), pc.greater_equal(table.column("output_length"), 1)),
        pc.is_valid(table.column("hash_ids")),
    )
    keep = np.flatnonzero(pc.fill_null(ok, False).to_numpy(zero_copy_only=False))
    if len(keep) == table.num_rows:
        return table, rows
    return table.take(pa.array(keep)), rows[keep]


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
    return _Raw(
        cat([r.rows for r in raws]),
        cat([r.ts for r in raws]),
        cat([r.ts_ok for r in raws]),
        cat([r.il for r in raws]),
        cat([r.il_ok for r in raws]),
        cat([r.ol for r in raws]),
        cat([r.ol_ok for r in raws]),
        cat([r.hash_len for r in raws]),
        cat([r.hash_vals for r in raws]),
        cat([r.hash_ok for r in raws]),
        optional,
        r0.ns_per_unit,
        r0.block_size,
        r0.metadata,
        shard_files=files,
        shard_start=start,
    )


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
    skipped = 0
    used: list[str] = []
    units = set()
    for f in files:
        fp = _Problems(f)
        try:
            table = pq.read_table(f)
        except (pa.ArrowException, OSError, ValueError) as e:
            probs.add(0, "file", f"not a readable Parquet file: {e}", file=f)
            continue
        meta, bs = _parquet_meta(table.schema.metadata, fp, opts)
        captured = CAPTURE_META.encode() in (table.schema.metadata or {})
        table, rows = replayable_rows(table)
        if captured and table.num_rows == 0:  # a capture's part with no replayable row
            skipped += 1
            continue
        raw = _raw_from_table(table, fp, meta, bs, opts, rows, synth)
        del table
        if raw is not None:
            _check_hash_counts(raw, fp)
        probs.items.extend(fp.items)
        if raw is not None:
            synth += int(raw.hash_len.sum()) if raw.metadata.get("hash_ids") == "synthesised" else 0
            units.add(raw.ns_per_unit)
            raws.append(raw)
            used.append(f)
    if probs or len(raws) + skipped != len(files):
        return None
    if not raws:
        probs.add(0, "file", "no replayable rows (every captured request failed or produced no output)")
        return None
    if len(units) > 1:
        probs.add(0, "metadata", "shards disagree on replayer.time_unit; convert them one by one first")
        return None
    return _concat_raw(raws, used)
