"""``trace inspect``: a trace's statistics, streamed batch by batch.

No I/O except :func:`inspect_trace`, which streams a source batch by batch (memory bounded by the
batch size plus the distinct hash ids and session ids seen, 8 bytes per hash id): rows, rates,
timestamp grid, lengths, sessions, hash-id reuse.

Expected prefix-cache hits: :class:`replayer.payload.prefix_cache.PrefixCacheModel`, the model a replay
uses, with the same row rule and defaults, so ``inspect`` and a replay of the whole trace report
the same ``expected_prefix_hit_tokens``.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from typing import Any

import numpy as np

from replayer.core.endpoints import COMPLETIONS, endpoint_kind
from replayer.payload.prefix_cache import (
    DEFAULT_CAPACITY_TOKENS,
    DEFAULT_KV_BLOCK_SIZE,
    PrefixCacheModel,
    expected_hits,
    modelled,
)
from replayer.trace import Trace, TraceSource, open_trace

__all__ = ["inspect_trace", "inspect_source", "format_inspect", "GRIDS_NS"]

#: Candidate timestamp grids, coarsest first: (label, ns).
GRIDS_NS = (
    ("1 s", 1_000_000_000),
    ("100 ms", 100_000_000),
    ("10 ms", 10_000_000),
    ("1 ms", 1_000_000),
    ("100 us", 100_000),
    ("1 us", 1_000),
)
PERCENTILES = (50, 90, 95, 99)


# --------------------------------------------------------------------------------------------
# Streaming accumulators


class _SortedSet:
    """A set of int64 kept as sorted disjoint numpy levels merged like a binary counter (LSM)."""

    def __init__(self) -> None:
        self.levels: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(int(lv.size) for lv in self.levels)

    def contains(self, x: np.ndarray) -> np.ndarray:
        out = np.zeros(x.shape[0], dtype=bool)
        for lv in self.levels:
            i = np.searchsorted(lv, x)
            np.minimum(i, lv.size - 1, out=i)
            out |= lv[i] == x
        return out

    def add_new(self, new_sorted: np.ndarray) -> None:
        """Add sorted unique values that are not in the set yet."""
        if new_sorted.size == 0:
            return
        self.levels.append(new_sorted)
        while len(self.levels) > 1 and self.levels[-2].size <= 2 * self.levels[-1].size:
            b = self.levels.pop()
            a = self.levels.pop()
            m = np.concatenate([a, b])
            m.sort(kind="stable")
            self.levels.append(m)


class _Hist:
    """Exact histogram of non-negative ints (lengths): percentiles without keeping the values."""

    def __init__(self) -> None:
        self.counts = np.zeros(0, dtype=np.int64)

    def add(self, v: np.ndarray) -> None:
        c = np.bincount(v)
        if c.size > self.counts.size:
            c[: self.counts.size] += self.counts
            self.counts = c
        else:
            self.counts[: c.size] += c

    def summary(self) -> dict[str, Any]:
        n = int(self.counts.sum())
        if n == 0:
            return {}
        vals = np.arange(self.counts.size)
        cum = np.cumsum(self.counts)
        out: dict[str, Any] = {
            "min": int(np.flatnonzero(self.counts)[0]),
            "max": int(np.flatnonzero(self.counts)[-1]),
            "mean": float((vals * self.counts).sum() / n),
        }
        for q in PERCENTILES:  # numpy method="inverted_cdf": smallest v with F(v) >= q
            out[f"p{q}"] = int(np.searchsorted(cum, math.ceil(q / 100 * n - 1e-9)))
        return out


def _grow_add(counts: np.ndarray, idx: np.ndarray) -> np.ndarray:
    c = np.bincount(idx)
    if c.size > counts.size:
        c[: counts.size] += counts
        return c
    counts[: c.size] += c
    return counts


def _expected_hits(model: PrefixCacheModel, t: Trace) -> int:
    """Expected hit tokens of batch ``t``'s rows the model sees (``prefix_cache.modelled``, the
    run's default endpoint: completions), fed to ``model`` in order."""
    kinds = None if t.endpoint is None else [endpoint_kind(e) if e else COMPLETIONS for e in t.endpoint]
    sessions = t.session_id
    synthetic = bool(getattr(t, "hash_ids_synthetic", False))
    if kinds is None and (sessions is None or not synthetic):
        return int(expected_hits(t, model=model).sum())
    hits = 0
    for i in range(len(t)):
        if modelled(COMPLETIONS if kinds is None else kinds[i], None if sessions is None else sessions[i], synthetic):
            hits += model.observe(t.hash_ids(i), int(t.input_length[i]))
    return hits


def inspect_source(
    source: TraceSource,
    *,
    cache_tokens: int | None = DEFAULT_CAPACITY_TOKENS,
    kv_block_size: int = DEFAULT_KV_BLOCK_SIZE,
    max_rows: int = 65_536,
) -> dict[str, Any]:
    """Statistics of a whole trace, streamed batch by batch (see :func:`inspect_trace` for the keys)."""
    bs = source.block_size
    rows = 0
    last_ns = 0
    per_s = np.zeros(0, dtype=np.int64)
    per_min = np.zeros(0, dtype=np.int64)
    grid_ok = {label: True for label, _ in GRIDS_NS}
    h_in, h_out = _Hist(), _Hist()
    tok_in = tok_out = 0
    seen = _SortedSet()
    model = PrefixCacheModel(bs, kv_block_size, cache_tokens)
    hits = 0
    sessions: Counter[str] | None = None  # session -> rows
    rows_with_session = 0
    endpoints: Counter[str] | None = None
    doc_rows = docs = None
    for t in source.batches(max_rows):
        n = len(t)
        if n == 0:
            continue
        ts = t.timestamp_ns
        rows += n
        last_ns = max(last_ns, int(ts[-1]))
        per_s = _grow_add(per_s, ts // 1_000_000_000)
        per_min = _grow_add(per_min, ts // 60_000_000_000)
        for label, g in GRIDS_NS:
            if grid_ok[label] and (ts % g).any():
                grid_ok[label] = False
        il, ol = t.input_length, t.output_length
        h_in.add(il)
        h_out.add(ol)
        tok_in += int(il.sum())
        tok_out += int(ol.sum())
        offs = np.asarray(t.hash_offsets, dtype=np.int64)
        flat = np.asarray(t.hash_values[int(offs[0]) : int(offs[-1])], dtype=np.int64)
        if flat.size:
            uniq = np.unique(flat)
            seen.add_new(uniq[~seen.contains(uniq)])
        hits += _expected_hits(model, t)
        if t.session_id is not None:
            if sessions is None:
                sessions = Counter()
            known = [s for s in t.session_id if s is not None]
            sessions.update(known)
            rows_with_session += len(known)
        if t.endpoint is not None:
            if endpoints is None:
                endpoints = Counter()
            endpoints.update(e if e is not None else "(not set)" for e in t.endpoint)
        if t.document_lengths is not None:
            known_docs = [d for d in t.document_lengths if d is not None]
            doc_rows = (doc_rows or 0) + len(known_docs)
            docs = (docs or 0) + sum(map(len, known_docs))
    span_s = last_ns / 1e9
    grid = next((label for label, _ in GRIDS_NS if grid_ok[label]), None) if rows else None
    out: dict[str, Any] = {
        "path": source.path,
        "format": source.metadata.get("format"),
        "block_size": bs,
        "rows": rows,
        "span_s": span_s,
        "mean_rate_per_s": rows / span_s if span_s > 0 else None,
        "mean_rate_per_min": rows / span_s * 60 if span_s > 0 else None,
        "peak_rate_per_s": int(per_s.max()) if rows else 0,
        "peak_rate_per_min": int(per_min.max()) if rows else 0,
        "timestamp_grid": grid,
        "input_length": h_in.summary(),
        "output_length": h_out.summary(),
        "total_input_tokens": tok_in,
        "total_output_tokens": tok_out,
        "total_tokens": tok_in + tok_out,
        "unique_blocks": len(seen),
        "expected_prefix_hit_tokens": hits,
        "expected_prefix_query_tokens": model.query_tokens,
        "prefix_hit_ratio": model.hit_ratio,
        "kv_block_size": kv_block_size,
        "cache_tokens": cache_tokens,
        "sessions": len(sessions) if sessions is not None else None,
        "rows_with_session": rows_with_session if sessions is not None else None,
        "multi_turn_sessions": sum(1 for c in sessions.values() if c > 1) if sessions is not None else None,
        "max_turns": max(sessions.values(), default=0) if sessions is not None else None,
        "endpoints": dict(sorted(endpoints.items())) if endpoints is not None else None,
        "rows_with_documents": doc_rows,
        "documents": docs,
    }
    if source.metadata.get("hash_ids") == "synthesised":
        out["hash_ids"] = "synthesised (no prefix information in the source)"
    return out


def inspect_trace(
    path: str | os.PathLike,
    *,
    cache_tokens: int | None = DEFAULT_CAPACITY_TOKENS,
    kv_block_size: int = DEFAULT_KV_BLOCK_SIZE,
    max_rows: int = 65_536,
    **open_opts: Any,
) -> dict[str, Any]:
    """Open ``path`` (:func:`replayer.trace.open_trace` options) and return its statistics.

    Keys: ``rows``; ``span_s`` (last arrival offset, s); ``mean_rate_per_s`` / ``_per_min``
    (rows / span); ``peak_rate_per_s`` / ``_per_min`` (most arrivals in one aligned 1 s / 60 s
    window from time 0); ``timestamp_grid`` (coarsest of 1 s .. 1 us that every offset is a multiple
    of, or None); ``input_length`` / ``output_length`` (min, max, mean, p50/p90/p95/p99 with numpy's
    ``inverted_cdf`` definition); ``total_*_tokens``; ``unique_blocks`` (distinct hash ids);
    ``expected_prefix_hit_tokens`` (``replayer.payload.prefix_cache``'s model, as a replay computes them:
    an LRU of ``cache_tokens`` tokens, None = infinite, whole ``kv_block_size`` KV blocks, the last
    prompt token recomputed), ``expected_prefix_query_tokens`` (input tokens of the rows the model
    sees) and ``prefix_hit_ratio`` (their ratio); ``sessions`` (distinct
    ``session_id`` values), ``rows_with_session``, ``multi_turn_sessions`` (sessions of >= 2 rows),
    ``max_turns`` (most rows in one session) - all None without the column; ``endpoints``
    (endpoint path -> rows, ``"(not set)"`` for rows without one; None without the column);
    ``rows_with_documents`` / ``documents`` (rows with ``document_lengths``, documents in them; None
    without the column). Raises TraceError for a bad trace.
    """
    return inspect_source(
        open_trace(path, **open_opts), cache_tokens=cache_tokens, kv_block_size=kv_block_size, max_rows=max_rows
    )


def format_inspect(s: dict[str, Any]) -> str:
    """Human-readable text of :func:`inspect_source`'s result."""

    def num(v, fmt="{:,.2f}"):
        return "-" if v is None else fmt.format(v)

    def lens(d):
        if not d:
            return "-"
        return (
            f"min {d['min']:,}  p50 {d['p50']:,}  p90 {d['p90']:,}  p95 {d['p95']:,}  p99 {d['p99']:,}  "
            f"max {d['max']:,}  mean {d['mean']:,.1f}"
        )

    cache = "infinite size" if s["cache_tokens"] is None else f"{s['cache_tokens']:,} tokens"
    lines = [
        f"trace            {s['path']} ({s['format']}, block size {s['block_size']})",
        f"rows             {s['rows']:,}",
        f"span             {s['span_s']:,.3f} s",
        f"mean rate        {num(s['mean_rate_per_s'])} /s   {num(s['mean_rate_per_min'])} /min",
        f"peak rate        {s['peak_rate_per_s']:,} /s   {s['peak_rate_per_min']:,} /min",
        f"timestamp grid   {s['timestamp_grid'] or 'finer than 1 us'}",
        f"input length     {lens(s['input_length'])}",
        f"output length    {lens(s['output_length'])}",
        f"tokens           {s['total_input_tokens']:,} in + {s['total_output_tokens']:,} out = {s['total_tokens']:,}",
        f"unique blocks    {s['unique_blocks']:,}" + (f"  ({s['hash_ids']})" if s.get("hash_ids") else ""),
        f"prefix hits      {num(s['prefix_hit_ratio'], '{:.2%}')}  ({s['expected_prefix_hit_tokens']:,} tokens "
        f"expected; LRU of {cache}, {s['kv_block_size']}-token KV blocks)",
    ]
    if s["sessions"] is None:
        lines.append("sessions         -")
    else:
        lines.append(
            f"sessions         {s['sessions']:,}  ({s.get('multi_turn_sessions') or 0:,} multi-turn, "
            f"max {s.get('max_turns') or 0:,} turns; {s['rows_with_session']:,} rows)"
        )
    if s.get("endpoints") is not None:
        lines.append("endpoints        " + "  ".join(f"{k} {v:,}" for k, v in s["endpoints"].items()))
    if s.get("rows_with_documents") is not None:
        lines.append(f"documents        {s['rows_with_documents']:,} rows, {s['documents']:,} documents")
    return "\n".join(lines)
