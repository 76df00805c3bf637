"""The schedule: which trace rows this process sends, in which loop, at which trace time; and the
timeline that turns trace time into due times on the run's clock.

Pure and deterministic (no clock reads, no I/O of its own): ``iter_schedule`` walks trace batches
(possibly several loops over the trace, possibly one shard of it) and yields ``ScheduleBatch``es
of trace-time offsets; ``Timeline`` maps a trace-time offset to a due time
``due_ns = wall0 + (trace_ns - trace0) / speedup`` (ns after the anchor ``t0_ns``). Changing the
speed-up or pausing re-anchors the timeline at the current trace position, so neither a burst
nor drift follows.

Trace time -> replay time, the one mapping (``--idle-gap-cap``, :class:`IdleGapCap`): take each
row's offset from the trace's first row (loop offsets included), apply the speed-up, then cap
every gap between consecutive rows of the whole schedule (all shards' rows, across loops) at
``cap_s`` seconds of *replay* time: ``replay(t) = (t - skipped(t)) / speedup`` where
``skipped(t)`` sums, over the gaps before ``t``, ``max(0, gap - cap_s * speedup)`` (the cap in
trace units at the run's starting speed-up; a later ``/speedup`` change keeps the capped
schedule). Example (case B34): offsets 0, 1, 1201, 1202 s at speed-up 10 with a 60 s cap are
due at 0, 0.1, 60.1, 60.2 s: one gap capped, 60 s of replay time skipped. ``ScheduleBatch.trace_ns``
holds the capped offsets (the due times follow from them); ``trace_pos_ns`` the trace's own, so
the trace position shown (metrics, console) stays the trace's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

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
    #: the rows' own trace offsets (ns, loop offset included) when --idle-gap-cap moved ``trace_ns``
    trace_pos_ns: np.ndarray | None = None
    #: with several targets: each row's target (index of ``--target``; ``replayer.send.routing``)
    targets: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.idx.size)


def column_value(batch: object, name: str, i: int) -> Any:
    """Row ``i``'s value of the optional column ``name`` of a trace batch (None without it)."""
    col = getattr(batch, name, None)
    return None if col is None else col[i]


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
    mine: np.ndarray = owner == shard
    return mine


def iter_schedule(
    open_batches: Callable[[], Iterable[Any]],
    *,
    loops: int | None = 1,
    loop_gap_ns: int = 0,
    shard: int = 0,
    shards: int = 1,
    max_requests: int | None = None,
    start_loop: int = 0,
    skip_rows: int = 0,
    skip: Callable[[int, np.ndarray], np.ndarray] | None = None,
    gap_cap: "IdleGapCap | None" = None,
    route: Any = None,
) -> Iterator[ScheduleBatch]:
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
    ``gap_cap``: caps idle gaps (module docstring); it sees every row, so shards agree.
    ``route``: a ``replayer.send.routing.TargetRoute`` giving each row its target; it too sees every
    row (before the shard split and the resume skips), so shards and resumed runs agree.
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
            ts = np.asarray(batch.timestamp_ns, dtype=np.int64)
            if ts.size == 0:
                continue
            any_rows = True
            last = int(ts[-1])
            rows = getattr(batch, "row_offset", 0) + np.arange(ts.size, dtype=np.int64)
            mask = shard_mask(batch, shard, shards)
            if max_requests is not None and gindex + ts.size > max_requests:
                mask[max(0, max_requests - gindex) :] = False
            gindex += int(ts.size)
            if loop == start_loop and skip_rows:
                mask &= rows >= skip_rows
            if skip is not None:
                mask &= ~skip(loop, rows)
            idx = np.flatnonzero(mask).astype(np.int64)
            pos = loop_base + ts
            at = gap_cap.apply(pos, rows, loop) if gap_cap is not None else pos
            targets = route.apply(batch, rows) if route is not None else None
            if idx.size:
                yield ScheduleBatch(
                    loop=loop,
                    batch=batch,
                    idx=idx,
                    trace_ns=at[idx],
                    rows=rows[idx],
                    first_index=index,
                    trace_pos_ns=pos[idx] if gap_cap is not None else None,
                    targets=targets[idx] if targets is not None else None,
                )
                index += int(idx.size)
        if not any_rows:
            return
        loop_base += (last or 0) + loop_gap_ns
        loop += 1


class IdleGapCap:
    """Caps the gaps between consecutive rows of the schedule (module docstring): ``apply``
    maps each batch's trace offsets to capped offsets, in schedule order, and counts what it
    did. ``report()``: ``cap_s``, ``gaps_capped``, ``time_skipped_s`` (replay seconds),
    ``trace_time_skipped_s``, and ``map``: for the first ``MAP_LIMIT`` capped gaps, the row
    after the gap with its trace and replay time (s from the first row); every later row of
    that stretch keeps its distance to it (divided by the speed-up)."""

    MAP_LIMIT = 1000

    def __init__(self, cap_s: float, speedup: float) -> None:
        if not cap_s > 0 or not speedup > 0:
            raise ValueError("cap_s and speedup must be > 0")
        self.cap_s, self.speedup = float(cap_s), float(speedup)
        self.cap_trace_ns = int(round(cap_s * 1e9 * speedup))
        self.prev_ns: int | None = None
        self.skipped_ns = 0  # trace ns skipped so far
        self.gaps = 0
        self.map: list[dict[str, Any]] = []

    def apply(self, trace_ns: np.ndarray, rows: np.ndarray | None = None, loop: int = 0) -> np.ndarray:
        ts = np.asarray(trace_ns, dtype=np.int64)
        if ts.size == 0:
            return ts
        prev = ts[0] if self.prev_ns is None else self.prev_ns
        gaps = np.diff(ts, prepend=np.int64(prev))
        excess = np.maximum(gaps - self.cap_trace_ns, 0)
        skipped = self.skipped_ns + np.cumsum(excess)
        out: np.ndarray = ts - skipped
        for i in np.flatnonzero(excess)[: max(0, self.MAP_LIMIT - len(self.map))]:
            self.map.append(
                {
                    "loop": int(loop),
                    "row": int(rows[i]) if rows is not None else None,
                    "trace_s": int(ts[i]) / 1e9,
                    "replay_s": int(out[i]) / 1e9 / self.speedup,
                }
            )
        self.gaps += int(np.count_nonzero(excess))
        self.skipped_ns = int(skipped[-1])
        self.prev_ns = int(ts[-1])
        return out

    def report(self) -> dict[str, Any]:
        return {
            "cap_s": self.cap_s,
            "gaps_capped": self.gaps,
            "time_skipped_s": self.skipped_ns / 1e9 / self.speedup,
            "trace_time_skipped_s": self.skipped_ns / 1e9,
            "map": self.map,
        }


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


def build_schedule(
    timestamp_ns: np.ndarray, *, speedup: float = 1.0, max_requests: int | None = None, duration_s: float | None = None
) -> Schedule:
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
