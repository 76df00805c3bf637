"""Cost of choosing targets (several ``--target``): prints numbers, asserts nothing.

The route (``replayer.send.routing.TargetRoute``) runs in the schedule's reader thread over every row
of the trace (all shards' rows), batch by batch (65,536 rows, as a run reads them). This times
it on a synthetic trace: ROWS rows, sessions of TURNS turns interleaved (a session's turns spread
over the trace), a share of rows without a session; for each policy, rows per second and the
peak of the session numbering (entries kept). Best of 3.

Run: ``.venv/bin/python bench/bench_routing.py [ROWS] [TURNS]`` (default 1,000,000 rows, 10 turns).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from replayer.plan.schedule import iter_schedule
from replayer.send.routing import TargetRoute

BATCH = 65_536


class _Batch:
    def __init__(self, ts: np.ndarray, sessions: list, row_offset: int) -> None:
        self.timestamp_ns, self.session_id, self.row_offset = ts, sessions, row_offset

    def __len__(self) -> int:
        return int(self.timestamp_ns.size)


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    turns = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    rng = np.random.default_rng(0)
    n_sessions = rows // turns
    sid = rng.integers(0, n_sessions, rows)
    no_session = rng.random(rows) < 0.1
    sessions = [None if no_session[i] else f"session-{sid[i]}" for i in range(rows)]
    ts = np.arange(rows, dtype=np.int64) * 1_000_000
    batches = [_Batch(ts[lo : lo + BATCH], sessions[lo : lo + BATCH], lo) for lo in range(0, rows, BATCH)]
    print(f"{rows:,} rows, ~{n_sessions:,} sessions, 10% of rows without a session, batches of {BATCH:,}")
    for policy in ("session-order", "session-hash"):
        best = float("inf")
        kept = 0
        for _ in range(3):
            route = TargetRoute(policy, 4)
            t = time.perf_counter()
            for _sb in iter_schedule(lambda: iter(batches), route=route):
                pass
            best = min(best, time.perf_counter() - t)
            kept = len(route.numbers)
        base = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for _sb in iter_schedule(lambda: iter(batches)):
                pass
            base = min(base, time.perf_counter() - t)
        print(
            f"{policy:14s} schedule with route {best:.3f} s, without {base:.3f} s: route {rows / (best - base):,.0f} "
            f"rows/s ({(best - base) / rows * 1e9:.0f} ns/row); session numbers kept {kept:,}"
        )


if __name__ == "__main__":
    main()
