"""The drift windows of results files retention removed, kept in their digest (``removed.json``),
so a week-long soak with ``--retain-size`` or ``--retain-age`` is judged over the whole run.

``digest_drift(path, prev)`` folds a results file about to be removed into the drift digest so
far: each window's sketches and counts (``drift.DriftFold``'s, as ``stats.stat_to_json``) keyed
by (loop, position), and each loop's first due time as absolute Unix ns (so files of a resumed
run, each with its own anchor, share one axis). The windows are cut at the run's
``--drift-window`` (from the file's ``replayer.config``); a loop's origin is its first due time
among the files removed so far. ``seed_fold`` puts a folder's digest back into a ``DriftFold``
on the axis of the judgement: the series then starts with the run's first window, not the oldest
file kept. The target's scraped signals of removed windows are not kept (retention trims them).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from replayer.core.stats import stat_from_json, stat_to_json
from replayer.record.folder import open_file
from replayer.results.driftwindows import COLUMNS, WINDOW_COUNTS, DriftFold, _Window, loop_origins

log = logging.getLogger(__name__)

#: the window of a file whose metadata names none (``RunConfig.drift_window_s``'s default)
DEFAULT_WINDOW_S = 300.0


def _window_s(meta: dict) -> float:
    try:
        return float(json.loads(meta[b"replayer.config"]).get("drift_window_s") or DEFAULT_WINDOW_S)
    except (KeyError, ValueError, TypeError, AttributeError):
        return DEFAULT_WINDOW_S


def digest_drift(path: str, prev: dict[str, Any] | None) -> dict[str, Any] | None:
    """The drift digest ``prev`` (None: none yet) with the results file ``path`` folded in; None
    when ``path`` cannot be read or has no run anchor (its windows cannot be placed)."""
    pf = open_file(path)
    if pf is None:
        return prev
    meta = pf.schema_arrow.metadata or {}
    if b"replayer.t0_wall_s" not in meta:
        return prev
    anchor_ns = round(float(meta[b"replayer.t0_wall_s"]) * 1e9)
    window_s = float(prev["window_s"]) if prev else _window_s(meta)
    names = set(pf.schema_arrow.names)  # (the schema is built anew at each access)
    table = pf.read(columns=[c for c in COLUMNS if c in names])
    origins = {int(k): v for k, v in (prev or {}).get("origins_ns", {}).items()}
    for lp, o in loop_origins(table.to_batches()).items():
        origins[lp] = min(origins.get(lp, o + anchor_ns), o + anchor_ns)
    fold = DriftFold(window_s, {lp: o - anchor_ns for lp, o in origins.items()})
    seed_windows(fold, prev)
    fold.add(table)
    return {
        "window_s": window_s,
        "origins_ns": {str(lp): o for lp, o in origins.items()},
        "windows": [
            [lp, p, {"stats": {m: stat_to_json(s) for m, s in w.stats.items()}, "n": _json_counts(w.n)}]
            for (lp, p), w in sorted(fold.windows.items())
        ],
    }


def seed_windows(fold: DriftFold, digest: dict[str, Any] | None) -> None:
    """Merge the windows of ``digest`` into ``fold`` (same (loop, position) keys: a window cut
    by a file boundary is whole again)."""
    for lp, p, d in (digest or {}).get("windows", []):
        w = fold.windows.setdefault((int(lp), int(p)), _Window())
        for m, sj in d["stats"].items():
            if m in w.stats:
                w.stats[m].merge(stat_from_json(sj))
        for k in WINDOW_COUNTS:  # (a count the digest lacks, or null in it: unknown, NaN)
            v = d["n"].get(k)
            w.n[k] = w.n.get(k, 0) + (float("nan") if v is None else v)


def _json_counts(n: dict[str, float]) -> dict[str, float | None]:
    """A window's counts for JSON: NaN (unknown) as null."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in n.items()}


def digest_origins(digests: list[dict[str, Any]]) -> dict[int, int]:
    """Each loop's first due time (absolute Unix ns) over the digests."""
    out: dict[int, int] = {}
    for d in digests:
        for k, v in d.get("origins_ns", {}).items():
            out[int(k)] = min(out.get(int(k), int(v)), int(v))
    return out


def usable(digests: list[dict[str, Any]], window_s: float) -> list[dict[str, Any]]:
    """The digests cut at ``window_s`` (others are left out, said: their windows cannot be
    re-cut)."""
    out = []
    for d in digests:
        if abs(float(d.get("window_s", 0)) - window_s) < 1e-9:
            out.append(d)
        else:
            log.warning(
                "drift: the windows of removed results files were cut at %g s, not %g s: left out",
                d.get("window_s"),
                window_s,
            )
    return out


__all__ = ["digest_drift", "digest_origins", "seed_windows", "usable"]
