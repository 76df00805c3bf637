"""Value checks and coercion: one cell or one column of values -> typed arrays or problems.

Integers (lengths, timestamps in a unit) and hash ids (integers or strings, with
:func:`hash_id_from_string`). Fast vectorised paths; the slow per-value paths only for values that
need them. Optional columns and the row rules between columns: ``replayer.trace.optional_columns``.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from typing import Any

import numpy as np

from replayer.trace.model import _HEX, _INT64_MAX, _MIN, _U64, HASH_ID_KEY, _Problems

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


#: the length fields bounded by ``length_bound`` (token counts)
LENGTH_FIELDS = frozenset({"input_length", "output_length", "query_length", "document_lengths"})
#: lengths beyond any served model's context (the longest today are ~10M tokens): refused, with
#: file, row and field, instead of failing at the server once per request; ``--max-trace-length``
DEFAULT_LENGTH_BOUND = 10_000_000
_BOUND = [DEFAULT_LENGTH_BOUND]


def length_bound() -> int:
    """The largest token length a trace row may give (``set_length_bound``)."""
    return _BOUND[0]


def set_length_bound(tokens: int) -> None:
    """Set the bound (the process's: a run's ``--max-trace-length``, before its trace is opened)."""
    if tokens < 1:
        raise ValueError(f"the length bound must be >= 1, got {tokens}")
    _BOUND[0] = tokens


def _bound_message(field_: str, value: int) -> str:
    return (
        f"{field_} {value} is beyond any served model: more than {_BOUND[0]} tokens "
        "(--max-trace-length raises the bound)"
    )


def _range_message(field_: str, value: int) -> str:
    if field_ == "timestamp":
        return f"negative timestamp {value}: must be >= 0"
    if field_ == "output_length" and value == 0:
        return "output_length 0 is not allowed: must be >= 1 (OpenAI-compatible servers refuse max_tokens 0)"
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
    if iv > _BOUND[0] and field_ in LENGTH_FIELDS:
        return None, _bound_message(field_, iv)
    return iv, None


def hash_id_from_string(s: str) -> int:
    """Map a string hash id to its unsigned 64-bit id (0 <= id < 2**64), the same everywhere.

    * Decimal digits (ASCII, no sign, no leading zero: how JSON, JavaScript's ``BigInt`` and
      databases print a 64-bit integer) are that integer: ``"4294967303"`` is the id 4294967303,
      so a trace gives the same prompts whether it writes its ids as numbers or as strings.
      A value >= 2**64 raises ValueError, and so does ``-`` followed by digits (a negative id),
      as for the integers themselves.
    * Otherwise exactly 16 hex digits (case-insensitive, no prefix; fixed-width hex, so a
      leading zero or a letter) parse as their 64-bit value, so ids printed as hex round-trip.
    * Any other non-empty string -> the big-endian 8-byte keyed blake2b digest
      (``digest_size=8``, ``key=HASH_ID_KEY``) of its UTF-8 bytes: an opaque name, the same id in
      every process and machine (never Python's salted ``hash()``, never cut to 32 bits).

    Raises ValueError (the message says why) for the empty string and the cases above.
    """
    if not s:
        raise ValueError("empty string is not a hash id")
    digits = s[1:] if s[0] == "-" else s
    if digits.isascii() and digits.isdigit() and (digits[0] != "0" or len(digits) == 1):
        if digits is not s:
            raise ValueError(f"negative hash id {_short(s)}: must be >= 0")
        v = int(s)
        if v >= _U64:
            raise ValueError(f"hash id {_short(s)} does not fit in 64 bits (must be < 2**64)")
        return v
    if len(s) == 16 and _HEX.issuperset(s):
        return int(s, 16)
    return hash_name(s)


def hash_name(s: str) -> int:
    """Any string (a name) -> its unsigned 64-bit id: the big-endian 8-byte keyed blake2b digest
    (``digest_size=8``, ``key=HASH_ID_KEY``) of its UTF-8 bytes; the same in every process."""
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8, key=HASH_ID_KEY).digest(), "big")


def _hash_ids_from_strings(strs: list[str]) -> np.ndarray | None:
    """Many string ids -> uint64 array, or None when one is not an id (the caller's slow path names it)."""
    try:
        return np.array([hash_id_from_string(x) for x in strs], dtype=np.uint64)
    except ValueError:
        return None


def _coerce_hash(v: Any) -> tuple[int | None, str | None]:
    """One hash id (int 0..2**64-1, integral float, or string) -> (int64 bit pattern, None) or (None, error)."""
    if isinstance(v, str):
        try:
            iv = hash_id_from_string(v)
        except ValueError as e:
            return None, str(e)
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
            assert iv is not None
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
    if field_ in LENGTH_FIELDS:
        huge = ok & (arr64 > _BOUND[0])
        if huge.any():
            for i in np.flatnonzero(huge):
                probs.add(rows[i], field_, _bound_message(field_, int(arr64[i])))
            ok &= ~huge
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
        vals: list[int] = []
        errors = []
        for j, v in enumerate(h):
            iv, err = _coerce_hash(v)
            if err is None:
                assert iv is not None
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
            elif types == {str}:
                vals = _hash_ids_from_strings(flat)
        if (
            vals is not None
            and vals.ndim == 1
            and vals.dtype.kind in "iu"
            and (vals.size == 0 or vals.dtype.kind == "u" or vals.min() >= 0)
        ):
            return lengths, vals.astype(np.int64, copy=False), np.ones(n, dtype=bool)
    return _hash_slow(lists, rows, probs)
