"""Trace tools: ``slice``, ``scale`` and ``sessionize`` (Trace -> Trace).

Pure, synchronous code over a whole :class:`replayer.trace.Trace` in memory; ``trace inspect``
(streaming statistics) is ``replayer.results.traceinspect``'s.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, cast

import numpy as np

from replayer.core.hashing import GAMMA, mix64, mix64_array
from replayer.trace import Trace, _cut_optional
from replayer.trace.values import hash_name

__all__ = ["take_rows", "slice_trace", "scale_trace", "sessionize_trace"]

_U = np.uint64


# --------------------------------------------------------------------------------------------
# Transformations (whole Trace in memory)


def take_rows(t: Trace, idx: np.ndarray, *, rebase: bool = True) -> Trace:
    """Rows ``idx`` (ascending int indexes) of ``t`` as a new Trace; ``rebase``: first row at time 0."""
    idx = np.asarray(idx, dtype=np.int64)
    offs = np.asarray(t.hash_offsets, dtype=np.int64)
    lens = offs[idx + 1] - offs[idx]
    new_off = np.zeros(idx.size + 1, dtype=np.int64)
    np.cumsum(lens, out=new_off[1:])
    gather = np.repeat(offs[idx] - new_off[:-1], lens) + np.arange(new_off[-1], dtype=np.int64)
    ts = t.timestamp_ns[idx]
    if rebase and ts.size:
        ts = ts - ts.min()
    return Trace(
        path=t.path,
        timestamp_ns=ts,
        input_length=t.input_length[idx],
        output_length=t.output_length[idx],
        hash_offsets=new_off,
        hash_values=np.asarray(t.hash_values, dtype=np.int64)[gather],
        block_size=t.block_size,
        source_row=t.source_row[idx],
        rows_out_of_order=0,
        metadata=dict(t.metadata),
        hash_ids_synthetic=t.hash_ids_synthetic,
        **_cut_optional(t, idx),
    )


def _unit_hash(seed: int, key: int) -> float:
    """Deterministic uniform in [0, 1) of (seed, 64-bit key)."""
    return mix64(mix64(seed) ^ (key & (2**64 - 1))) / 2.0**64


def slice_trace(  # noqa: C901, PLR0912
    t: Trace,
    *,
    start_s: float | None = None,
    end_s: float | None = None,
    head: int | None = None,
    fraction: float | None = None,
    seed: int = 0,
    whole_sessions: bool = True,
) -> Trace:
    """Keep a part of ``t``; all given criteria apply together; the result starts at time 0.

    * ``start_s``/``end_s``: rows with ``start_s <= offset < end_s`` (seconds from the first row).
    * ``head``: the first ``head`` rows (after the window).
    * ``fraction`` with ``seed``: each session (rows without a session: each row, keyed by source
      row) is kept when ``mix64(mix64(seed) ^ key) / 2**64 < fraction``, key = the session id's
      keyed blake2b digest (:func:`replayer.trace.values.hash_name`: any string, empty or
      ``"-1"`` too); deterministic, independent of row order.
    * ``whole_sessions`` (default): a session is kept with all its rows, or not at all; it is kept
      when its first row is selected (so a window or head may pull in later turns past its end).

    Raises ValueError for bad arguments or when nothing is left.
    """
    n = len(t)
    sel = np.ones(n, dtype=bool)
    if start_s is not None:
        sel &= t.timestamp_ns >= int(round(start_s * 1e9))
    if end_s is not None:
        sel &= t.timestamp_ns < int(round(end_s * 1e9))
    if head is not None:
        if head < 0:
            raise ValueError(f"head must be >= 0, got {head}")
        keep = np.flatnonzero(sel)[:head]
        sel = np.zeros(n, dtype=bool)
        sel[keep] = True
    sess = t.session_id
    if fraction is not None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be within [0, 1], got {fraction}")
        cache: dict[str, bool] = {}
        for i in np.flatnonzero(sel).tolist():
            s = sess[i] if sess is not None else None
            if s is None:
                sel[i] = _unit_hash(seed, int(t.source_row[i])) < fraction
            else:
                if s not in cache:
                    cache[s] = _unit_hash(seed, hash_name(s)) < fraction
                sel[i] = cache[s]
    if whole_sessions and sess is not None:
        first_sel: dict[str, bool] = {}
        for i, s in enumerate(sess):
            if s is not None and s not in first_sel:
                first_sel[s] = bool(sel[i])
        for i, s in enumerate(sess):
            if s is not None:
                sel[i] = first_sel[s]
    idx = np.flatnonzero(sel)
    if idx.size == 0:
        raise ValueError("no rows left after slicing")
    out = take_rows(t, idx)
    out.metadata["source"] = (t.metadata.get("source") or os.path.basename(t.path)) + " (sliced)"
    return out


def prefix_chain(offs: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """uint64 per flat position ``p``: SplitMix64 chain hash of its row's ids up to and including ``p``.

    ``offs`` int64[n+1] starts at 0; ``vals`` int64 ids. O(total ids): positions are grouped once
    (stable argsort) and each prefix length is one vectorised step.
    """
    lens = np.diff(offs)
    vals = np.asarray(vals, dtype=np.int64).view(np.uint64)
    prefix = np.empty(vals.size, dtype=np.uint64)
    if vals.size == 0:
        return prefix
    row_of = np.repeat(np.arange(lens.size), lens)
    pos = np.arange(vals.size) - offs[:-1][row_of]
    mixed = mix64_array(vals ^ _U(GAMMA))
    by_pos = np.argsort(pos, kind="stable")
    ends = np.cumsum(np.bincount(pos))
    at = by_pos[: ends[0]]
    prefix[at] = mix64_array(mixed[at])
    for p in range(1, ends.size):
        at = by_pos[ends[p - 1] : ends[p]]
        prefix[at] = mix64_array(prefix[at - 1] ^ mixed[at])
    return prefix


def _rehash_scaled(t: Trace, factor: float, new_len: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """New hash ids for input lengths scaled by ``factor`` (rule in :func:`scale_trace`)."""
    bs = t.block_size
    offs = np.asarray(t.hash_offsets, dtype=np.int64)
    offs = offs - offs[0]
    lens = np.diff(offs)
    n = len(t)
    # prefix[p] = hash chain of the row's ids up to and including flat position p
    prefix = prefix_chain(offs, t.hash_values)
    nb = (new_len + (bs - 1)) // bs
    new_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(nb, out=new_off[1:])
    nrow = np.repeat(np.arange(n), nb)
    j = np.arange(new_off[-1], dtype=np.int64) - new_off[:-1][nrow]
    m = np.ceil((j + 1) / factor - 1e-9).astype(np.int64)
    m = np.clip(m, 1, lens[nrow])
    chain = prefix[offs[:-1][nrow] + m - 1]
    ids = mix64_array(chain ^ mix64_array(j.astype(np.uint64) + _U(0x632BE59BD9B4E019)))
    return new_off, (ids >> _U(1)).astype(np.int64)  # < 2**63: plain non-negative int64


def scale_trace(t: Trace, *, time_factor: float = 1.0, input_factor: float = 1.0, output_factor: float = 1.0) -> Trace:
    """Scale times and lengths; returns a new Trace.

    * ``timestamp_ns`` -> ``round(offset * time_factor)`` (2.0 = twice as long, half the rate).
    * ``output_length`` -> ``max(1, round(L * output_factor))``.
    * ``input_length`` -> ``L' = max(1, round(L * input_factor))`` and, when ``input_factor != 1``,
      hash ids are recomputed so that prefix sharing scales with the text: new block ``j`` covers
      original tokens up to ``(j + 1) * block_size / input_factor``, i.e. the original blocks
      ``0 .. m_j - 1`` with ``m_j = min(n, ceil((j + 1) / input_factor))``; its id is a 64-bit hash
      (SplitMix64 chain, top bit cleared) of (those original ids in order, ``j``). Two rows that
      shared their first ``m_j`` original ids share new block ``j``; every row has
      ``ceil(L' / block_size)`` ids. All ids are replaced (a new id space below 2**63).
      Rows with ``document_lengths`` scale each part instead: ``query_length`` and every document
      length -> ``max(1, round(x * input_factor))``, and ``L'`` is their sum (the rule stays true).
    * ``think_time_s`` -> ``think_time_s * time_factor``.

    Raises ValueError for a factor that is not a positive finite number.
    """
    for name, f in (("time_factor", time_factor), ("input_factor", input_factor), ("output_factor", output_factor)):
        if not (isinstance(f, (int, float)) and math.isfinite(f) and f > 0):
            raise ValueError(f"{name} must be a positive number, got {f!r}")
    ts = (
        np.round(t.timestamp_ns.astype(np.float64) * time_factor).astype(np.int64)
        if time_factor != 1
        else np.array(t.timestamp_ns)
    )
    ol = np.maximum(1, np.round(t.output_length * output_factor)).astype(np.int64)
    parts: dict[str, Any] = {}
    if input_factor != 1:
        il = np.maximum(1, np.round(t.input_length * input_factor)).astype(np.int64)
        if t.document_lengths is not None:

            def sc(x: int) -> int:
                return max(1, round(x * input_factor))

            ql: list[int | None] = list(t.query_length) if t.query_length is not None else [None] * len(t)
            dl = list(t.document_lengths)
            for i, d in enumerate(dl):
                if d is not None:
                    dl[i] = scaled = [sc(x) for x in d]
                    q = ql[i]
                    ql[i] = q = None if q is None else sc(q)
                    il[i] = (q or 0) + sum(scaled)
            parts = {"document_lengths": dl, "query_length": ql if t.query_length is not None else None}
        offs, vals = _rehash_scaled(t, input_factor, il)
    else:
        il = np.array(t.input_length)
        offs, vals = np.asarray(t.hash_offsets) - t.hash_offsets[0], np.array(t.hash_values)
    meta = dict(t.metadata)
    meta["source"] = (meta.get("source") or os.path.basename(t.path)) + (
        f" (scaled: time x{time_factor:g}, input x{input_factor:g}, output x{output_factor:g})"
    )
    # Rehashed synthesised ids stay free of prefix information: hash_ids_synthetic is kept.
    if t.think_time_s is not None and time_factor != 1:
        parts["think_time_s"] = np.asarray(t.think_time_s, dtype=np.float64) * time_factor
    return dataclasses.replace(
        t,
        timestamp_ns=ts,
        input_length=il,
        output_length=ol,
        hash_offsets=offs,
        hash_values=vals,
        rows_out_of_order=0,
        metadata=meta,
        row_offset=0,
        **parts,
    )


def sessionize_trace(t: Trace, *, min_shared_blocks: int = 1) -> tuple[Trace, dict[str, int]]:
    """Chain the rows of a trace without sessions into sessions by shared leading hash ids.

    Rows are walked in time order. Row ``r`` continues the session of the most recent earlier row
    ``P`` such that (1) ``P``'s hash ids except its last one (which may be a partial block) - its
    ``f = len(P) - 1`` full blocks - are the first ``f`` ids of ``r``, with ``f >= min_shared_blocks``,
    and (2) ``P`` is still the latest row of its session (a session is a chain, never a tree).
    Otherwise ``r`` starts a new session. Sessions are named ``"s<k>"`` (k = 0, 1, ... in order of
    their first row); ``turn`` is the 0-based row index within the session.

    O(total hash ids): a 64-bit chain hash of every prefix (:func:`prefix_chain`) keys a dict of
    sessions whose latest row has exactly that full-block prefix; the chosen row is then compared
    id by id (a hash collision never joins rows).

    Returns ``(trace, summary)``: every row and column of ``t`` with ``session_id`` and ``turn``
    replaced; summary keys ``rows``, ``sessions``, ``multi_turn_sessions``, ``max_turns``.
    Raises ValueError for ``min_shared_blocks < 1`` or synthesised hash ids (no prefix information).
    """
    if isinstance(min_shared_blocks, bool) or not isinstance(min_shared_blocks, int) or min_shared_blocks < 1:
        raise ValueError(f"min_shared_blocks must be an integer >= 1, got {min_shared_blocks!r}")
    if t.hash_ids_synthetic:
        raise ValueError(f"{t.path}: hash ids are synthesised (no prefix information): rows cannot be chained")
    k = min_shared_blocks
    n = len(t)
    offs = np.asarray(t.hash_offsets, dtype=np.int64)
    offs = offs - offs[0]
    vals = np.asarray(t.hash_values, dtype=np.int64)
    keys = prefix_chain(offs, vals)
    sess = np.zeros(n, dtype=np.int64)
    turn = np.zeros(n, dtype=np.int64)
    latest: list[int] = []  # session -> its latest row
    # prefix key -> [(row, session)] in row order; entries whose row is no longer its session's latest
    # are stale and dropped lazily from the end (each at most once)
    by_key: dict[int, list[tuple[int, int]]] = {}
    offs_l = offs.tolist()
    for i in range(n):
        a, b = offs_l[i], offs_l[i + 1]
        best = None
        if b - a >= k:
            for key in keys[a + k - 1 : b].tolist():  # prefixes of k .. len(row) ids
                lst = by_key.get(key)
                while lst and latest[lst[-1][1]] != lst[-1][0]:
                    lst.pop()
                if lst and (best is None or lst[-1][0] > best[0]):
                    best = lst[-1]
        if best is not None:
            p, s = best
            f = offs_l[p + 1] - offs_l[p] - 1
            if not np.array_equal(vals[offs_l[p] : offs_l[p] + f], vals[a : a + f]):
                best = None  # 64-bit collision
        if best is None:
            s = len(latest)
            latest.append(i)
            turn[i] = 0
        else:
            latest[s] = i
            turn[i] = turn[best[0]] + 1
        sess[i] = s
        f = b - a - 1  # this row's full blocks
        if f >= k:
            by_key.setdefault(int(keys[a + f - 1]), []).append((i, s))
    counts = np.bincount(sess, minlength=len(latest)) if n else np.zeros(0, dtype=np.int64)
    summary = {
        "rows": n,
        "sessions": len(latest),
        "multi_turn_sessions": int((counts > 1).sum()),
        "max_turns": int(counts.max()) if counts.size else 0,
    }
    meta = dict(t.metadata)
    meta["source"] = (meta.get("source") or os.path.basename(t.path)) + f" (sessionized: min {k} shared blocks)"
    turns = cast("list[int | None]", turn.tolist())
    out = dataclasses.replace(t, session_id=[f"s{x}" for x in sess.tolist()], turn=turns, metadata=meta)
    return out, summary
