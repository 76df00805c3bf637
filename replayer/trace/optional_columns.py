"""Optional columns and the row rules between columns: values -> typed columns or problems.

The optional columns (ids, model, priority, extra_body, sessions and their parents, endpoints,
query/document lengths, think times, images) are checked value by value here, each problem named
by row and field; ``_check_requests`` applies the rules between a row's columns (an endpoint's
needs, lengths that must add up). The integer and hash-id checks they rely on are
``replayer.trace.values``'s.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from replayer.trace.images import IMAGE_COLUMNS, image_value
from replayer.trace.model import (
    _ENDPOINT_PATH,
    _INT64_MAX,
    _MIN,
    _QUERY_ENDPOINTS,
    ENDPOINTS,
    EXTRA_BODY_RESERVED,
    _Problems,
)
from replayer.trace.values import _MISSING, _coerce_int, _short, _type_name


def _is_nan(v: Any) -> bool:
    return isinstance(v, (float, np.floating)) and math.isnan(v)


def _no_parent(v: Any) -> bool:
    """A negative integer parent id (``-1``: "no parent" in some traces, e.g. Alibaba's) is no parent."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return bool(v < 0)
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
    out: list[int] = []
    for j, x in enumerate(v):
        iv, err = _coerce_int(x, "document_lengths", 1)
        if err is not None or iv is None:
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
            for k in np.flatnonzero(bad):
                probs.add(
                    rows[k],
                    "think_time_s",
                    f"think_time_s {float(out[k])!r} is not allowed: must be a finite number >= 0 (seconds)",
                )
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
            probs.add(
                rows[i], "think_time_s", f"think_time_s {fv!r} is not allowed: must be a finite number >= 0 (seconds)"
            )
            continue
        out[i] = fv
    return out


def _optional_column(
    name: str, values: list | pa.ChunkedArray, rows: np.ndarray, probs: _Problems
) -> list | np.ndarray:
    """Check one optional column -> list in file order (None = not set), or a float64 array for ``think_time_s``."""
    if name == "think_time_s":
        return _think_times(values, rows, probs)
    if isinstance(values, pa.ChunkedArray):
        struct = pa.types.is_struct(values.type)
        values = values.to_pylist()
        if struct and name == "extra_body":  # every row has every field of a struct: null = absent
            values = [_without_nulls(v) for v in values]
    return _optional_from_list(name, values, rows, probs)


def _without_nulls(v: Any) -> Any:
    """A struct value (dict) without its null fields, at every depth."""
    if isinstance(v, dict):
        return {k: _without_nulls(x) for k, x in v.items() if x is not None}
    return v


def _optional_from_list(name: str, values: list, rows: np.ndarray, probs: _Problems) -> list:  # noqa: C901, PLR0912, PLR0915
    out: list = []
    if name in IMAGE_COLUMNS:
        for i, v in enumerate(values):
            val, err = (None, None) if v is _MISSING or v is None else image_value(name, v)
            if err is not None:
                probs.add(rows[i], name, err)
            out.append(val)
        return out
    for i, v in enumerate(values):
        if v is _MISSING or v is None:
            out.append(None)
            continue
        if name in ("request_id", "session_id", "parent_request_id", "tenant"):
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
                probs.add(
                    rows[i],
                    name,
                    f"unknown endpoint {_short(v)}: expected one of "
                    f"{', '.join(ENDPOINTS.values())} or the short names "
                    f"{', '.join(ENDPOINTS)}",
                )
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
        elif name == "priority":  # any int64, negative too (vLLM: lower runs first)
            if _is_nan(v):  # a float column's NaN means "not set" (as null)
                out.append(None)
                continue
            iv, err = _coerce_int(v, name, -_INT64_MAX - 1)
            if err is not None:
                probs.add(rows[i], name, err)
            out.append(iv)
        else:  # extra_body
            parsed = v
            if isinstance(v, str):
                try:
                    parsed = orjson.loads(v)
                except orjson.JSONDecodeError as e:
                    probs.add(rows[i], name, f"not valid JSON: {e}")
                    out.append(None)
                    continue
                if not isinstance(parsed, dict):
                    probs.add(rows[i], name, f"expected a JSON object, got {_type_name(parsed)}")
                    out.append(None)
                    continue
            elif not isinstance(v, dict):
                probs.add(rows[i], name, f"expected a JSON object (or a string holding one), got {_type_name(v)}")
                out.append(None)
                continue
            reserved = EXTRA_BODY_RESERVED.intersection(parsed)
            if reserved:
                probs.add(
                    rows[i],
                    name,
                    f"sets {', '.join(map(repr, sorted(reserved)))}, which the replayer "
                    "sets per request (prompt, output length, streaming): not allowed",
                )
                out.append(None)
            else:
                out.append(v if isinstance(v, str) else orjson.dumps(v).decode())
    return out


def _check_requests(
    rows: np.ndarray, il: np.ndarray, il_ok: np.ndarray, optional: dict[str, Any], probs: _Problems
) -> None:
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
                probs.add(
                    r,
                    "document_lengths",
                    f"query_length {qi or 0} + sum(document_lengths) {docs} = {(qi or 0) + docs} "
                    f"!= input_length {int(il[i])}: they must be equal",
                )
