"""Due times: when each trace row is sent, as absolute offsets from the run anchor.

Pure and deterministic: ``due_ns[i] = round(trace_offset_ns[i] / speedup)``. Offsets are measured
from the trace's smallest timestamp (the trace layer already re-based and stably sorted them), so
``due_ns`` is non-decreasing. ``--speedup 10`` replays ten times faster than the trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Schedule:
    """``rows[i]`` (trace row index) is due at ``due_ns[i]`` ns after the anchor; both int64,
    same length, ``due_ns`` non-decreasing."""

    rows: np.ndarray
    due_ns: np.ndarray

    def __len__(self) -> int:
        return int(self.rows.size)

    @property
    def span_ns(self) -> int:
        """Due time of the last request (0 for an empty schedule)."""
        return int(self.due_ns[-1]) if self.due_ns.size else 0


def build_schedule(timestamp_ns: np.ndarray, *, speedup: float = 1.0, max_requests: int | None = None,
                   duration_s: float | None = None) -> Schedule:
    """Schedule for trace offsets ``timestamp_ns`` (int64, sorted, from 0).

    ``speedup`` > 0 divides every offset. ``max_requests`` keeps the first N rows;
    ``duration_s`` keeps rows due before that many seconds of replay time. Raises ValueError for
    a non-positive speedup or an unsorted input.
    """
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
