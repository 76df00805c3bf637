"""Mixing traces: several traces (tenants) on one clock, as one trace with a ``tenant`` column.

A mix entry names a trace, its tenant, a time offset (seconds added to every arrival), a rate
(arrivals ``rate`` times as fast: offsets divided by it; think times kept) and optionally the
hash id scope of its ids. Each trace is read whole (:func:`read_trace`), then:

* **hash scope**: a trace whose ids are local (``hash_id_scope`` "local" in its metadata, as
  the agentic readers write, or given in the entry) has its ids salted by its tenant name
  (``agentic.salt_ids``), so two traces never share a block by accident; "global" (the default
  for a trace that declares nothing, e.g. Mooncake) keeps its ids, so two slices of one trace
  share what they really share. Synthesised ids (no prefix information) are always salted, and
  stay in the synthesised range.
* **sessions**: ``session_id``, ``request_id`` and ``parent_request_id`` get the prefix
  ``<tenant>/``, so sessions of two tenants never wait on each other.
* **time**: every trace starts at its own time 0, then ``offset_s + t / rate``; rows of all
  traces are stable-sorted by time (ties keep the entries' order).

All traces must have one block size (prompts are built with one). The mix keeps every row in
memory (as JSONL and CSV traces are).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from replayer.trace.agentic import ID_MASK, salt_ids, scope_key
from replayer.trace.model import _OPTIONAL, SYNTH_ID_BASE, Trace, TraceError, TraceProblem, _readonly
from replayer.trace.read import read_trace

SCOPES = ("local", "global")


@dataclasses.dataclass(frozen=True)
class MixEntry:
    """One trace of a mix: path, tenant name, offset (s), rate, hash id scope (None: the trace's own)."""

    trace: str
    tenant: str
    offset_s: float = 0.0
    rate: float = 1.0
    hash_id_scope: str | None = None


def parse_entry(spec: str | dict) -> MixEntry:
    """``"PATH[,tenant=NAME][,offset_s=S][,rate=R][,hash_id_scope=local|global]"`` or a mapping
    with those keys (``trace`` for the path) -> MixEntry. The tenant defaults to the file name
    without its extensions. Raises ValueError naming the bad part."""
    if isinstance(spec, dict):
        items = dict(spec)
        path = items.pop("trace", None)
    else:
        path, *parts = str(spec).split(",")
        items = {}
        for part in parts:
            if "=" not in part:
                raise ValueError(f"mix entry {spec!r}: {part!r} is not KEY=VALUE")
            k, v = part.split("=", 1)
            items[k.strip()] = v.strip()
    if not path:
        raise ValueError(f"mix entry {spec!r}: no trace path")
    unknown = set(items) - {"tenant", "offset_s", "rate", "hash_id_scope"}
    if unknown:
        raise ValueError(
            f"mix entry {spec!r}: unknown key(s) {', '.join(sorted(unknown))} "
            "(keys: tenant, offset_s, rate, hash_id_scope)"
        )
    tenant = str(items.get("tenant") or os.path.basename(str(path)).split(".")[0])
    try:
        offset = float(items.get("offset_s", 0.0))
        rate = float(items.get("rate", 1.0))
    except (TypeError, ValueError):
        raise ValueError(f"mix entry {spec!r}: offset_s and rate must be numbers") from None
    if not (np.isfinite(offset) and offset >= 0):
        raise ValueError(f"mix entry {spec!r}: offset_s must be >= 0")
    if not (np.isfinite(rate) and rate > 0):
        raise ValueError(f"mix entry {spec!r}: rate must be > 0")
    scope = items.get("hash_id_scope")
    if scope is not None and scope not in SCOPES:
        raise ValueError(f"mix entry {spec!r}: hash_id_scope must be local or global")
    return MixEntry(str(path), tenant, offset, rate, scope)


def format_entry(e: MixEntry) -> str:
    """The one-string form of ``e`` (what :func:`parse_entry` reads back)."""
    s = f"{e.trace},tenant={e.tenant},offset_s={e.offset_s:g},rate={e.rate:g}"
    return s + (f",hash_id_scope={e.hash_id_scope}" if e.hash_id_scope else "")


def _prefixed(col: list | None, tenant: str, n: int) -> list | None:
    return None if col is None else [None if v is None else f"{tenant}/{v}" for v in col][:n]


def mix_traces(entries: list[MixEntry], **read_options) -> Trace:
    """One trace of ``entries`` (module docstring), with ``tenant`` set on every row.
    ``read_options`` go to :func:`read_trace` for every trace. Raises TraceError (a trace's
    problems, block sizes that differ, a mix of traces with and without synthesised ids)."""
    if not entries:
        raise ValueError("a mix needs at least one trace")
    tenants = [e.tenant for e in entries]
    if len(set(tenants)) != len(tenants):
        raise ValueError(f"mix: tenant names must differ, got {', '.join(tenants)}")
    traces = [read_trace(e.trace, **read_options) for e in entries]
    probs = []
    bs = {t.block_size for t in traces}
    if len(bs) > 1:
        probs.append(
            TraceProblem(
                entries[0].trace,
                0,
                "block_size",
                "mixed traces need one block size: "
                + ", ".join(f"{e.tenant} {t.block_size}" for e, t in zip(entries, traces)),
            )
        )
    if len({t.hash_ids_synthetic for t in traces}) > 1:
        probs.append(
            TraceProblem(
                entries[0].trace,
                0,
                "hash_ids",
                "cannot mix traces with synthesised hash ids (no prefix information) and traces with hash ids",
            )
        )
    if probs:
        raise TraceError(probs)
    parts_ts, parts_vals, parts_len, parts_src = [], [], [], []
    cols: dict[str, list] = {name: [] for name in _OPTIONAL if name not in ("think_time_s", "tenant")}
    have = {name: any(getattr(t, name) is not None for t in traces) for name in _OPTIONAL}
    think: list[np.ndarray] = []
    tenant_col: list[str] = []
    for e, t in zip(entries, traces):
        n = len(t)
        parts_ts.append(e.offset_s * 1e9 + t.timestamp_ns / e.rate)
        vals = np.asarray(t.hash_values, dtype=np.int64)
        scope = e.hash_id_scope or t.metadata.get("hash_id_scope", "global")
        if t.hash_ids_synthetic:
            vals = (salt_ids(vals, scope_key("tenant:" + e.tenant)) & np.int64(ID_MASK)) | np.int64(SYNTH_ID_BASE)
        elif scope == "local":
            vals = salt_ids(vals, scope_key("tenant:" + e.tenant))
        parts_vals.append(vals)
        parts_len.append(np.diff(t.hash_offsets))
        parts_src.append(t.source_row)
        for name in cols:
            if not have[name]:
                continue
            col = getattr(t, name)
            if name in ("session_id", "request_id", "parent_request_id"):
                col = _prefixed(col, e.tenant, n)
            cols[name].extend(col if col is not None else [None] * n)
        if have["think_time_s"]:
            think.append(t.think_time_s if t.think_time_s is not None else np.full(n, np.nan))
        tenant_col.extend([e.tenant] * n)
    ts = np.rint(np.concatenate(parts_ts)).astype(np.int64)
    order = np.argsort(ts, kind="stable")
    lens = np.concatenate(parts_len)[order]
    starts = np.concatenate([[0], np.cumsum(np.concatenate(parts_len))[:-1]]).astype(np.int64)[order]
    flat = np.concatenate(parts_vals)
    gather = np.repeat(starts, lens) + (
        np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    )
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    cols["tenant"] = tenant_col
    have["tenant"] = True
    opt: dict[str, Any] = {name: ([col[i] for i in order] if have[name] else None) for name, col in cols.items()}
    opt["think_time_s"] = _readonly(np.concatenate(think)[order]) if have["think_time_s"] else None
    meta = {
        "format": "mix",
        "time_unit": "ns",
        "block_size": str(traces[0].block_size),
        "hash_id_scope": "global",
        "tenants": ",".join(tenants),
        "source": "mix of " + "; ".join(format_entry(e) for e in entries),
    }
    return Trace(
        path=entries[0].trace,
        timestamp_ns=_readonly(ts[order] - int(ts.min())),
        input_length=_readonly(np.concatenate([t.input_length for t in traces])[order]),
        output_length=_readonly(np.concatenate([t.output_length for t in traces])[order]),
        hash_offsets=_readonly(offsets),
        hash_values=_readonly(flat[gather]),
        block_size=traces[0].block_size,
        source_row=_readonly(np.concatenate(parts_src)[order]),
        rows_out_of_order=0,
        metadata=meta,
        hash_ids_synthetic=traces[0].hash_ids_synthetic,
        **opt,
    )


def open_mix(entries: list[MixEntry], **read_options):
    """The mix of ``entries`` as a :class:`TraceSource` (read whole, served in batches)."""
    from replayer.trace.source import _LoadedSource

    return _LoadedSource(mix_traces(entries, **read_options))
