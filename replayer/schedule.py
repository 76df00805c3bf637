"""The schedule: which trace rows this process sends, in which loop, at which trace time; and the
timeline that turns trace time into due times on the run's clock.

Pure and deterministic (no clock reads, no I/O of its own): ``iter_schedule`` walks trace batches
(possibly several loops over the trace, possibly one shard of it) and yields ``ScheduleBatch``es
of trace-time offsets; ``Timeline`` maps a trace-time offset to a due time
``due_ns = wall0 + (trace_ns - trace0) / speedup`` (ns after the anchor ``t0_ns``). Changing the
speed-up or pausing re-anchors the timeline at the current trace position, so neither a burst
nor drift follows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ScheduleBatch:
    """Scheduled rows of one trace batch in one loop.

    ``batch``: the trace batch (``replayer.trace.Trace``); ``idx``: int64 indices into it of the
    rows this shard sends; ``trace_ns``: their trace-time offsets (ns, loop offset included,
    non-decreasing); ``rows``: their global trace row numbers (0-based); ``first_index``: schedule
    position of the first of them (counts across loops).
    """

    loop: int
    batch: object
    idx: np.ndarray
    trace_ns: np.ndarray
    rows: np.ndarray
    first_index: int

    def __len__(self) -> int:
        return int(self.idx.size)


def shard_mask(batch: object, shard: int, shards: int) -> np.ndarray:
    """Rows of ``batch`` owned by shard ``shard`` of ``shards`` (bool array).

    Rows with a ``session_id`` go by a keyed 64-bit hash of it (BLAKE2b), so a session stays in
    one shard; other rows go by global row number modulo ``shards``. Deterministic on every
    machine; the shards together own every row exactly once.
    """
    n = len(batch)  # type: ignore[arg-type]
    if shards == 1:
        return np.ones(n, dtype=bool)
    rows = getattr(batch, "row_offset", 0) + np.arange(n, dtype=np.int64)
    owner = rows % shards
    sessions = getattr(batch, "session_id", None)
    if sessions is not None:
        for i, s in enumerate(sessions):
            if s is not None:
                h = int.from_bytes(hashlib.blake2b(str(s).encode(), digest_size=8).digest(), "little")
                owner[i] = h % shards
    return owner == shard


def iter_schedule(open_batches: Callable[[], Iterable[object]], *, loops: int | None = 1,
                  loop_gap_ns: int = 0, shard: int = 0, shards: int = 1,
                  max_requests: int | None = None, start_loop: int = 0,
                  skip_rows: int = 0,
                  skip: Callable[[int, np.ndarray], np.ndarray] | None = None) -> Iterator[ScheduleBatch]:
    """Yield the schedule batch by batch.

    ``open_batches()`` returns a fresh iterator of trace batches (each a ``Trace`` whose
    ``timestamp_ns`` are offsets from the trace's first timestamp and whose ``row_offset`` is its
    first global row). ``loops``: passes over the trace (None = forever); loop k+1 starts
    ``loop_gap_ns`` of trace time after the last request of loop k. ``max_requests`` keeps the
    first N requests of the whole schedule (all loops, before the shard split and the resume
    skips): N shards together, or a run and its resumed runs, send those N once.
    ``start_loop``/``skip_rows``: resume at that loop and global row (rows before it in
    that loop are skipped; trace time is kept, so the timeline must be re-anchored by the caller).
    ``skip(loop, rows)``: a bool mask of rows to leave out (rows already recorded, on resume).
    """
    if shards < 1 or not 0 <= shard < shards:
        raise ValueError(f"shard must be in 0..{shards - 1}, got {shard}")
    index = 0
    # position in the whole schedule: resuming at a later loop, the loops before count too
    gindex = start_loop * sum(len(b) for b in open_batches()) if max_requests and start_loop else 0
    loop = start_loop
    loop_base = 0
    while loops is None or loop < loops:
        last = None
        any_rows = False
        for batch in open_batches():
            if max_requests is not None and gindex >= max_requests:
                return
            ts = np.asarray(batch.timestamp_ns, dtype=np.int64)  # type: ignore[attr-defined]
            if ts.size == 0:
                continue
            any_rows = True
            last = int(ts[-1])
            rows = getattr(batch, "row_offset", 0) + np.arange(ts.size, dtype=np.int64)
            mask = shard_mask(batch, shard, shards)
            if max_requests is not None and gindex + ts.size > max_requests:
                mask[max(0, max_requests - gindex):] = False
            gindex += int(ts.size)
            if loop == start_loop and skip_rows:
                mask &= rows >= skip_rows
            if skip is not None:
                mask &= ~skip(loop, rows)
            idx = np.flatnonzero(mask).astype(np.int64)
            if idx.size:
                yield ScheduleBatch(loop=loop, batch=batch, idx=idx, trace_ns=loop_base + ts[idx],
                                    rows=rows[idx], first_index=index)
                index += int(idx.size)
        if not any_rows:
            return
        loop_base += (last or 0) + loop_gap_ns
        loop += 1


class Timeline:
    """Maps trace time to due time: ``due = wall0 + (trace_ns - trace0) / speedup`` (ns after
    the anchor). ``set_speedup``/``pause``/``resume`` re-anchor at the current trace position."""

    def __init__(self, speedup: float = 1.0, *, wall0_ns: int = 0, trace0_ns: int = 0) -> None:
        if not speedup > 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self.speedup = float(speedup)
        self.wall0_ns = wall0_ns
        self.trace0_ns = trace0_ns
        self.paused_trace_ns: int | None = None

    @property
    def paused(self) -> bool:
        return self.paused_trace_ns is not None

    def due(self, trace_ns: int) -> int:
        """Due time (ns after the anchor) of trace offset ``trace_ns``; huge while paused."""
        if self.paused_trace_ns is not None:
            return 2**62
        return self.wall0_ns + round((trace_ns - self.trace0_ns) / self.speedup)

    def trace_at(self, wall_ns: int) -> int:
        """The trace position reached at ``wall_ns`` (ns after the anchor)."""
        if self.paused_trace_ns is not None:
            return self.paused_trace_ns
        return self.trace0_ns + round((wall_ns - self.wall0_ns) * self.speedup)

    def set_speedup(self, speedup: float, now_ns: int) -> None:
        if not speedup > 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        if self.paused_trace_ns is None:
            self.trace0_ns, self.wall0_ns = self.trace_at(now_ns), now_ns
        self.speedup = float(speedup)

    def pause(self, now_ns: int) -> None:
        if self.paused_trace_ns is None:
            self.paused_trace_ns = self.trace_at(now_ns)

    def resume(self, now_ns: int) -> None:
        if self.paused_trace_ns is not None:
            self.trace0_ns, self.wall0_ns = self.paused_trace_ns, now_ns
            self.paused_trace_ns = None


# -- compatibility helper for callers with one in-memory trace ---------------------------------
@dataclass(frozen=True)
class Schedule:
    """A flat schedule: ``rows[i]`` due at ``due_ns[i]`` (int64, non-decreasing)."""

    rows: np.ndarray
    due_ns: np.ndarray

    def __len__(self) -> int:
        return int(self.rows.size)


def build_schedule(timestamp_ns: np.ndarray, *, speedup: float = 1.0, max_requests: int | None = None,
                   duration_s: float | None = None) -> Schedule:
    """Flat schedule of one in-memory trace (offsets ``timestamp_ns``, sorted): due =
    offset / ``speedup``, cut to ``max_requests`` and to rows due before ``duration_s``.
    Raises ValueError for a non-positive speedup or unsorted input."""
    if not speedup > 0:
        raise ValueError(f"speedup must be > 0, got {speedup}")
    ts = np.asarray(timestamp_ns, dtype=np.int64)
    if ts.size and np.any(np.diff(ts) < 0):
        raise ValueError("timestamps must be sorted (the trace reader sorts them)")
    due = np.rint(ts / speedup).astype(np.int64) if speedup != 1.0 else ts.copy()
    n = due.size
    if duration_s is not None:
        n = min(n, int(np.searchsorted(due, int(duration_s * 1e9), side="left")))
    if max_requests is not None:
        n = min(n, max_requests)
    return Schedule(rows=np.arange(n, dtype=np.int64), due_ns=due[:n])
