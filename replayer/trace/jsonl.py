"""Reader of Mooncake JSONL and generic JSONL (or a JSON array of objects): file -> ``_Raw``.

A fractional timestamp reaches the nanosecond exactly as written: orjson gives a binary double,
whose shortest repr is the written number when it has at most 15 significant digits; a longer one
is re-read from its line as a ``Decimal``.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import numpy as np
import orjson

from replayer.trace.columns import _Raw
from replayer.trace.images import check_image_rows
from replayer.trace.mapping import _Opts, _src, _synth_hash, map_hint
from replayer.trace.model import _OPTIONAL, _REQUIRED, DEFAULT_BLOCK_SIZE, DEFAULT_TIME_UNIT, _Problems
from replayer.trace.optional_columns import _check_requests, _optional_column
from replayer.trace.timestamps import _timestamps
from replayer.trace.values import _MISSING, _hash_from_lists, _ints_from_list, _type_name


def _lossy(v: Any) -> bool:
    """A float whose double may differ from the number written (over 15 significant digits: its
    shortest repr is longer than 16 characters); such a timestamp is re-read from the text as a
    Decimal. A shorter one (``55.4``) is exactly its repr, which ``timestamps`` uses."""
    return type(v) is float and len(repr(v)) > 16


#: ServeGen content-hash traces (alibaba/ServeGen ``data/offline``): 16-token blocks, no arrival
#: times (one batch task, submitted whole: every row at time 0) and no output lengths.
SERVEGEN_BLOCK_SIZE = 16
#: Output length given to ServeGen rows that have none (said in the trace's ``source`` metadata).
SERVEGEN_OUTPUT_LENGTH = 128


def _read_servegen(path: str, probs: _Problems, opts: _Opts) -> _Raw | None:
    """ServeGen content-hash JSONL: ``request_id``, ``type``, ``input_length``, ``hash_ids``
    (16-token blocks), ``img_ids`` (equal ids = the same image). Rows without ``timestamp`` arrive
    at 0 (a batch task); rows without ``output_length`` get ``SERVEGEN_OUTPUT_LENGTH``."""
    mapping = {"image_ids": "img_ids", **opts.mapping}
    bs = opts.block_size if opts.block_size is not None else SERVEGEN_BLOCK_SIZE
    o2 = _Opts("jsonl", bs, opts.strict, mapping, opts.time_unit, opts.allow_float_time)
    raw = _read_jsonl(path, probs, o2, defaults={"timestamp": 0, "output_length": SERVEGEN_OUTPUT_LENGTH})
    if raw is not None:
        raw.metadata["format"] = "servegen"
        raw.metadata["source"] = (
            f"ServeGen content-hash trace (alibaba/ServeGen data/offline; rows without "
            f"output_length given {SERVEGEN_OUTPUT_LENGTH}, without timestamp 0): " + path.rsplit("/", 1)[-1]
        )
        raw.metadata["license"] = "Apache-2.0"
    return raw


def _read_jsonl(path: str, probs: _Problems, opts: _Opts, defaults: dict | None = None) -> _Raw | None:  # noqa: C901, PLR0912, PLR0915
    """Mooncake / generic JSONL (or a JSON array): rows are physical line numbers (array: index+1).
    ``defaults``: values of keys a row does not have."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        probs.add(0, "file", f"cannot read: {e.strerror or e}")
        return None
    objs: list[dict] = []
    rows: list[int] = []
    tkey = _src(opts, "timestamp")
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
        for idx, o in enumerate(arr, 1):
            if isinstance(o, dict):
                objs.append(o)
                rows.append(idx)
            else:
                probs.add(idx, "json", f"expected a JSON object, got {_type_name(o)}")
        if any(_lossy(o.get(tkey)) for o in objs):
            exact = [o for o in json.loads(data, parse_float=Decimal) if isinstance(o, dict)]
            for o, exact_o in zip(objs, exact):
                if type(o.get(tkey)) is float:
                    o[tkey] = exact_o[tkey]
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
            if _lossy(o.get(tkey)):
                o[tkey] = json.loads(line, parse_float=Decimal)[tkey]  # (see _lossy)
            objs.append(o)
            rows.append(lineno)
    del data
    for k, v in (defaults or {}).items():
        for o in objs:
            o.setdefault(k, v)
    if not objs:
        if not probs:
            probs.add(0, "file", "no rows (empty trace)")
        return None
    absent = [(name, k) for name in _REQUIRED if (k := _src(opts, name)) and not any(k in o for o in objs)]
    for name, k in absent:  # one problem about the key, not one per row
        mapped = f" (--map {name}={k})" if k != name else ""
        probs.add(
            0,
            name,
            f"missing from every row: no row has the key {k!r}{mapped} (keys of row {rows[0]}: "
            f"{', '.join(map(str, objs[0])) or 'none'}){map_hint(name, list(map(str, objs[0])))}",
        )
    if absent:
        return None
    rows_a = np.array(rows, dtype=np.int64)
    unit = opts.time_unit or DEFAULT_TIME_UNIT
    ts, ts_ok, ns = _timestamps([o.get(tkey, _MISSING) for o in objs], rows_a, unit, opts.allow_float_time, probs)
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
    check_image_rows(rows_a, optional, probs)
    meta = {"format": opts.fmt, "time_unit": unit, "block_size": str(bs)}
    if not _src(opts, "hash_ids"):
        meta["hash_ids"] = "synthesised"
    return _Raw(rows_a, ts, ts_ok, *cols["input_length"], *cols["output_length"], hl, hv, hok, optional, ns, bs, meta)
