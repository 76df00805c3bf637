"""Writing and conversion: :func:`trace_table`, :func:`write_parquet`, :func:`coarsest_unit`
and :func:`convert` (read any format, optionally cut, write canonical Parquet)."""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from replayer.trace.model import (
    _OPTIONAL_TYPES,
    DEFAULT_TIME_UNIT,
    META_PREFIX,
    ROW_GROUP_SIZE,
    SCHEMA_VERSION,
    TIME_UNITS,
    Trace,
)
from replayer.trace.read import read_trace


def trace_table(
    trace: Trace,
    *,
    time_unit: str = "ms",
    source: str = "",
    license: str = "",  # noqa: A002
    extra_metadata: dict[str, str] | None = None,
) -> pa.Table:
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
        raise ValueError(
            f"timestamp offset {int(ts[i])} ns (row {i + 1}) is not a whole number of "
            f"{time_unit}; choose a finer time_unit"
        )
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
    for key in ("hash_id_scope", "notes"):  # kept through conversion (agentic readers, mixes)
        if trace.metadata.get(key):
            meta[key] = trace.metadata[key]
    meta.update(extra_metadata or {})
    return pa.table(cols).replace_schema_metadata({META_PREFIX + k: v for k, v in meta.items()})


def write_parquet(
    trace: Trace, path: str | os.PathLike, *, time_unit: str = "ms", source: str = "", license: str = ""
) -> None:  # noqa: A002 - the metadata key is "license"
    """Write ``trace`` as canonical Parquet (schema in ``docs/reference/trace-formats.md``; table as :func:`trace_table`).

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


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    fmt: str = "auto",
    block_size: int | None = None,
    source: str | None = None,
    license: str = "",
    first_seconds: float | None = None,  # noqa: A002
    strict: bool = False,
    mapping: str | dict[str, str] | None = None,
    time_unit: str | None = None,
) -> Trace:
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
        isinstance(first_seconds, (int, float))
        and not isinstance(first_seconds, bool)
        and math.isfinite(first_seconds)
        and first_seconds > 0
    ):
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
    meta.update(
        source=source,
        license=license or meta.get("license", ""),
        time_unit=unit,
        schema_version=SCHEMA_VERSION,
        block_size=str(trace.block_size),
    )
    return dataclasses.replace(trace, path=os.fspath(dst), metadata=meta)
