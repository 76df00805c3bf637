"""Timestamp columns: integers in a unit, fractional numbers or date-time strings -> int64
values, an ok mask and nanoseconds per value unit."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_EVEN, Decimal

import numpy as np
import pyarrow as pa

from replayer.trace.model import _INT64_MAX, TIME_UNITS, _Problems
from replayer.trace.values import _MISSING, _coerce_int, _ints_checked, _ints_from_list, _ints_slow, _short, _type_name

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


def _timestamps(  # noqa: PLR0912
    values: list | pa.ChunkedArray, rows: np.ndarray, unit: str, allow_float: bool, probs: _Problems
) -> tuple[np.ndarray, np.ndarray, int]:
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
        if not allow_float:
            ts, ok = _ints_slow(values, rows, "timestamp", probs)
            return ts, ok, ns
        ts, ok = _exact_ns(values, rows, unit, ns, probs)
        return ts, ok, 1
    # Fractional values in a coarse unit: convert to integer ns once, here.
    ok = np.isfinite(f) & (f >= 0) & (f * ns <= _INT64_MAX)
    for i in np.flatnonzero(~ok):
        v = float(f[i])
        probs.add(
            rows[i],
            "timestamp",
            "expected a number, got NaN"
            if math.isnan(v)
            else (
                f"negative timestamp {v!r}: must be >= 0"
                if v < 0
                else f"timestamp {v!r} {unit} does not fit in int64 ns"
            ),
        )
    return np.where(ok, np.round(np.where(ok, f, 0) * ns), 0).astype(np.int64), ok, 1


def _exact_ns(values: list, rows: np.ndarray, unit: str, ns: int, probs: _Problems) -> tuple[np.ndarray, np.ndarray]:
    """Numbers in ``unit`` (ints, floats, or Decimals holding a value exactly as written) -> int64 ns,
    rounded half-even to the nanosecond. A float is taken as its shortest repr (``55.4`` ms is
    55,400,000 ns, not the binary double's 55,399,999.99...), so no precision is lost on the way.
    """
    out = np.zeros(len(values), dtype=np.int64)
    ok = np.ones(len(values), dtype=bool)
    for i, v in enumerate(values):
        if isinstance(v, (float, Decimal)):
            d = Decimal(repr(float(v))) if isinstance(v, float) else v
            if d.is_nan():
                err = "expected a number, got NaN"
            elif d < 0:
                err = f"negative timestamp {_short(v)}: must be >= 0"
            elif not d.is_finite() or d * ns > _INT64_MAX:
                err = f"timestamp {_short(v)} {unit} does not fit in int64 ns"
            else:
                out[i] = int((d * ns).to_integral_value(ROUND_HALF_EVEN))
                continue
        else:
            iv, int_err = _coerce_int(v, "timestamp", 0)
            if int_err is not None:
                err = int_err
            else:
                assert iv is not None
                if iv * ns <= _INT64_MAX:
                    out[i] = iv * ns
                    continue
                err = f"timestamp {iv} {unit} does not fit in int64 ns"
        ok[i] = False
        probs.add(rows[i], "timestamp", err)
    return out, ok
