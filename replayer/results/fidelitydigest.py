"""The fidelity figures of results files retention removed, kept in their digest (``removed.json``'s
``fold.fidelity``), so the fidelity verdict of a soak with ``--retain-size`` or ``--retain-age``
covers the whole run, as the drift verdict's windows do (``driftdigest``).

What is kept of the files removed, bounded in size whatever the run's length:

- the counts (rows, sent, never sent, held back by the cap and by sessions, lengths judged and
  differing): summed, exact;
- the dispatch lag as a ``Stat`` (``stats.stat_to_json``): count and max exact, percentiles from
  its DDSketch (within ``stats.RELATIVE_ACCURACY``) once merged with the files kept;
- the inter-arrivals as two gap streams (``fidelitygaps.GapStream``) of the trace's due times and
  of the send times, in absolute Unix ns (the files of a resumed run, each with its own anchor,
  share one axis): gap histograms on the comparison's grid, exact, and the times of the last
  moments pending. A request recorded in a later file ended after this file's last result and
  took at most about as long as the longest seen so far, so times older than the file's last
  end less twice that longest time (and ``HORIZON_MARGIN_NS``) are folded; a later time below
  what was folded is left out and counted (the verdict then says the comparison is approximate).

Requests held back by ``--max-concurrency`` beyond the lag bound are counted at the bound of the
run that removed the files (``fidelity_max_lag_ms`` of the file's ``replayer.config``); the
verdict names that bound (``from_digest``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow.compute as pc

from replayer.core.stats import stat_from_json, stat_to_json
from replayer.record.folder import open_file
from replayer.results.fidelity import COLUMNS, FidelityBounds, FidelityFold
from replayer.results.fidelitygaps import GapStream

log = logging.getLogger(__name__)

#: the slack beyond twice the longest request seen before times are folded (ns)
HORIZON_MARGIN_NS = 10 * 10**9


def _lag_bound(meta: dict) -> float:
    """The run's ``--fidelity-max-lag`` (ms) from a results file's metadata, else the default."""
    try:
        v = json.loads(meta[b"replayer.config"]).get("fidelity_max_lag_ms")
        return float(v) if v is not None else FidelityBounds.max_lag_ms
    except (KeyError, ValueError, TypeError, AttributeError):
        return FidelityBounds.max_lag_ms


def _longest_ns(table: Any, start: str) -> int:
    """The longest ``end_ns - start`` of ``table`` (0 when none is known)."""
    if "end_ns" not in table.schema.names or start not in table.schema.names:
        return 0
    v = pc.max(pc.subtract(table.column("end_ns"), table.column(start))).as_py()
    return max(int(v or 0), 0)


def digest_fidelity(path: str, prev: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fidelity digest ``prev`` (None: none yet) with the results file ``path`` folded in;
    ``prev`` when ``path`` cannot be read."""
    pf = open_file(path)
    if pf is None:
        return prev
    meta = pf.schema_arrow.metadata or {}
    prev = prev or {}
    bound = float(prev.get("lag_bound_ms") or _lag_bound(meta))
    names = set(pf.schema_arrow.names)  # (the schema is built anew at each access)
    table = pf.read(columns=[c for c in (*COLUMNS, "end_ns") if c in names])
    fold = FidelityFold()
    fold.add(table, lag_bound_ms=bound)
    for k, v in (prev.get("n") or {}).items():
        fold.n[k] = fold.n.get(k, 0) + int(v)
    if prev.get("lag"):
        fold.lag.merge(stat_from_json(prev["lag"]))
    due, sent = GapStream(prev.get("due")), GapStream(prev.get("sent"))
    h_due, h_sent = prev.get("horizon_ns") or [0, 0]
    due_t, sent_t = fold.times()
    wall = meta.get(b"replayer.t0_wall_s")
    end = pc.max(table.column("end_ns")).as_py() if "end_ns" in table.schema.names else None
    if wall is None or end is None:  # (its times cannot be placed: left out, counted)
        due.late += int(due_t.size)
        sent.late += int(sent_t.size)
        if sent_t.size:
            log.warning("fidelity digest: %s has no run anchor or no end times: its inter-arrivals are left out", path)
    else:
        anchor = round(float(wall) * 1e9)
        h_due, h_sent = max(h_due, _longest_ns(table, "due_ns")), max(h_sent, _longest_ns(table, "sent_ns"))
        last_end = int(end) + anchor
        due.fold(due_t + anchor, last_end - 2 * h_due - HORIZON_MARGIN_NS)
        sent.fold(sent_t + anchor, last_end - 2 * h_sent - HORIZON_MARGIN_NS)
    return {
        "lag_bound_ms": bound,
        "files": int(prev.get("files", 0)) + 1,
        "n": dict(fold.n),
        "lag": stat_to_json(fold.lag),
        "horizon_ns": [h_due, h_sent],
        "due": due.to_json(),
        "sent": sent.to_json(),
    }


def seed_fidelity(fold: FidelityFold, digest: dict[str, Any], origin_ns: int) -> None:
    """Put a folder's digest into ``fold`` before its files kept are added (their times on an
    axis ``origin_ns`` Unix ns after the digest's): counts, the lag's statistic, the gap streams."""
    for k, v in (digest.get("n") or {}).items():
        fold.n[k] = fold.n.get(k, 0) + int(v)
    if digest.get("lag"):
        fold.lag.merge(stat_from_json(digest["lag"]))
    fold.seed_streams(GapStream(digest.get("due")), GapStream(digest.get("sent")), origin_ns)
    fold.removed = {
        "files": int(digest.get("files", 0)),
        "requests": int((digest.get("n") or {}).get("sent", 0)),
        "lag_bound_ms": digest.get("lag_bound_ms"),
        "late": {"trace": 0, "achieved": 0},
    }


__all__ = ["digest_fidelity", "seed_fidelity"]
