"""The HTTP errors of a run told apart (issue 47): a 429 (rate limited: the server, or a gateway
in front of it, refused the pace) and a 503 (overloaded: no capacity) ask for different
answers, while both are the one error kind ``http_status``. A closed set of classes, counted in
the summary fold: ``rate_limited`` (429), ``overloaded`` (503), ``other`` (any other status)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: the fold's counters (``foldcolumns.COUNTS``) and the summary's names for them
CLASSES = {"http_rate_limited": "rate_limited", "http_overloaded": "overloaded", "http_other": "other"}
RATE_LIMITED, OVERLOADED = 429, 503


def count(n: dict[str, int], t: pa.Table | pa.RecordBatch, failed: np.ndarray) -> None:
    """Add the failed ``http_status`` requests of one table to ``n``, by class (none without its
    ``http_status`` and ``error_kind`` columns)."""
    if "http_status" not in t.schema.names or "error_kind" not in t.schema.names:
        return
    status, kind = t.column("http_status"), t.column("error_kind")
    is_http = np.asarray(pc.equal(kind, "http_status").to_numpy(zero_copy_only=False), dtype=bool) & failed
    if not is_http.any():
        return
    codes = pc.fill_null(status, 0).to_numpy(zero_copy_only=False)[is_http]
    limited, overloaded = int((codes == RATE_LIMITED).sum()), int((codes == OVERLOADED).sum())
    n["http_rate_limited"] += limited
    n["http_overloaded"] += overloaded
    n["http_other"] += len(codes) - limited - overloaded


def section(n: dict[str, int]) -> dict[str, dict[str, int]]:
    """The summary's ``http_errors`` ({rate_limited, overloaded, other}) as ``{"http_errors": ...}``;
    {} without HTTP errors."""
    if not any(n.get(k) for k in CLASSES):
        return {}
    return {"http_errors": {name: int(n.get(k, 0)) for k, name in CLASSES.items()}}
