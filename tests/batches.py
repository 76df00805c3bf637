"""A minimal trace batch for dispatcher tests (tests only): due times in ms, no sessions."""

from __future__ import annotations

import numpy as np


class TimeBatch:
    """The part of a trace batch the dispatcher's schedule reads: ``timestamp_ns``, ``row_offset``,
    ``session_id`` (none) and ``len``."""

    def __init__(self, ts_ms: list[int]) -> None:
        self.timestamp_ns = np.array(ts_ms, dtype=np.int64) * 1_000_000
        self.row_offset = 0
        self.session_id = None

    def __len__(self) -> int:
        return len(self.timestamp_ns)
