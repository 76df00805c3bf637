"""A run summary's fold (``fold.SummaryFold``) as JSON and back: retention keeps the fold of each
results file it removes in the folder's ``removed.json``, so a summary of the folder still counts
them (counts exact, percentiles from the sketch)."""

from __future__ import annotations

import math

import numpy as np

from replayer.core.stats import stat_from_json, stat_to_json
from replayer.results.fold import SummaryFold


def fold_to_json(fold) -> dict:
    """A ``fold.SummaryFold`` as JSON (its statistics as ``stats.stat_to_json``)."""
    return {
        "n": fold.n,
        "stats": {k: stat_to_json(s) for k, s in fold.stats.items()},
        "errors": fold.errors,
        "endpoints": fold.endpoints,
        "audit": fold.audit,
        "sessions": sorted(fold.sessions),
        "verdict": fold.verdict,
        "slos": fold.slos,
        "partial_known": fold.partial_known,
        "estimate_known": fold.estimate_known,
        "sent_min": fold.sent_min if math.isfinite(fold.sent_min) else None,
        "end_max": fold.end_max if math.isfinite(fold.end_max) else None,
        "drift_max_abs": fold.drift_max_abs,
        "pooled": fold.pooled,
        "images": {"n": fold.images.n, "seen": fold.images.seen},
        "warmup_last_sent": fold.warmup_last_sent if math.isfinite(fold.warmup_last_sent) else None,
        "warm_tokens": [
            fold.warm_tokens.first.tolist(),
            fold.warm_tokens.last.tolist(),
            fold.warm_tokens.tokens.tolist(),
        ],
    }


def fold_from_json(d: dict):
    """The ``fold.SummaryFold`` that ``fold_to_json`` wrote."""
    fold = SummaryFold(d.get("slos") or {})
    for k, v in d.get("n", {}).items():
        fold.n[k] = fold.n.get(k, 0) + v
    fold.stats = {k: stat_from_json(v) for k, v in d.get("stats", {}).items()}
    fold.errors = dict(d.get("errors", {}))
    fold.endpoints = {k: dict(v) for k, v in d.get("endpoints", {}).items()}
    fold.audit = {k: dict(v) for k, v in d.get("audit", {}).items()}
    fold.sessions = set(d.get("sessions", []))
    fold.verdict = _verdict_from_json(d.get("verdict") or {})
    fold.partial_known, fold.estimate_known = bool(d.get("partial_known")), bool(d.get("estimate_known"))
    fold.sent_min = d["sent_min"] if d.get("sent_min") is not None else math.inf
    fold.end_max = d["end_max"] if d.get("end_max") is not None else -math.inf
    fold.drift_max_abs = d.get("drift_max_abs")
    fold.pooled = bool(d.get("pooled"))
    images = d.get("images") or {}
    for k, v in images.get("n", {}).items():
        fold.images.n[k] = fold.images.n.get(k, 0) + v
    fold.images.seen = bool(images.get("seen"))
    if d.get("warmup_last_sent") is not None:
        fold.warmup_last_sent = d["warmup_last_sent"]
    if d.get("warm_tokens"):
        fold.warm_tokens.add(*(np.asarray(v, dtype=np.float64) for v in d["warm_tokens"]))
    return fold


def jsonable(v):
    """numpy values and arrays (the verdict's counts) as JSON values."""
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return {"__array__": v.tolist()}
    if isinstance(v, np.generic):
        return v.item()
    return v


def _verdict_from_json(v):
    if isinstance(v, dict):
        if set(v) == {"__array__"}:
            return np.asarray(v["__array__"])
        return {k: _verdict_from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_verdict_from_json(x) for x in v]
    return v
