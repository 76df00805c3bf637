"""The drift verdict: is the server getting slower over a soak (``summary.json``'s ``drift``)?

The run is cut into windows of ``--drift-window`` seconds of trace position: a window is
(loop, position), a request belonging to the window its due time falls in, counted from its
loop's first due time. Per window: TTFT, ITL, TPOT and E2E p10/p50/p90/p99, error rate, goodput
(requests per second that met every ``--goodput`` bound), achieved rate (sent per second),
the offered load (due requests, their prompt tokens and output tokens asked for, per second: the
trace's, known before any response), in flight (sum of E2E / window: Little's law), and the
target's own signals where its ``/metrics`` was scraped (KV-cache usage, requests waiting,
preemptions per second, process memory).

**Paired across loops** (``--loop``): each window's value minus that of the window at the same
position in the first loop, over the time between them: the workload's own pattern (a burst at
minute 7 of the trace) is in both and cancels. **Without loops**, each value has the part the
offered load explains taken out first (``trend.load_adjusted``: least squares on the offered
requests, prompt tokens and output tokens per second, fitted jointly with time), so a quiet
stretch of the trace is not read as a server that recovered. The requests in flight are not a
covariate: they are the offered rate times the latency (Little's law), so a server getting
slower raises them with its latency, and a fit on them takes the drift for load (or turns it
around).

A window whose dispatch lag p99 is above the fidelity bound is left out of the trends
(``lagging``): the replayer's host was the bottleneck then, so its latencies measure the host.

Then, per metric, the Theil-Sen slope over time with Sen's interval (``trend.theil_sen``). A
metric drifts when the interval excludes 0 **and** the change the slope implies over the run is
at least ``min_change_pct`` of its level (the first loop's median, or the first windows'): the
interval alone would call a 0.1 % change on a long soak drift; and in the direction that is
worse (a trend for the better, a server warming up, is listed in ``improving``, not drift). Where it started: the best hinge
(``trend.change_start``). ``too_short``: fewer than ``MIN_WINDOWS`` windows (or, paired, fewer
than that in loops after the first).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replayer.results.driftwindows import LATENCIES, OFFERED, SERVER
from replayer.results.numtext import count, plain
from replayer.results.trend import MAX_PAIRS, change_start, load_adjusted, median_interval, theil_sen

#: fewer windows than this (paired: in the loops after the first) and the verdict is too_short
MIN_WINDOWS = 6
#: the confidence of each slope's interval (high: a dozen metrics are tested at once)
CONFIDENCE = 0.99
#: the quantiles trended: p10 is the floor (the server's service time with the least queueing and
#: the least delay of the client's host, whose scheduling noise is in p50 and p90 of every
#: latency the client measures: on a busy host p10 follows a drift most closely; not ITL's, which
#: is 0 where the client reads two tokens at once); p50 and p90 the typical and the slow requests
TRENDED_QUANTILES = (10, 50, 90)
#: the metrics tested for a trend: (name, unit, which way is worse)
TRENDED: tuple[tuple[str, str, int], ...] = (
    *(
        (f"{m}_p{q}_ms", "ms", 1)
        for m in (*LATENCIES, *SERVER)
        for q in TRENDED_QUANTILES
        if not (m == "itl" and q == 10)
    ),
    ("error_rate", "ratio", 1),
    ("goodput_rps", "1/s", -1),
    ("achieved_rps", "1/s", -1),
    ("kv_cache_usage", "ratio", 1),
    ("requests_waiting", "requests", 1),
    ("preemptions_per_s", "1/s", 1),
    ("process_memory_bytes", "bytes", 1),
)


def _values(series: list[dict[str, Any]], key: str) -> np.ndarray:
    return np.array([np.nan if r.get(key) is None else float(r[key]) for r in series], dtype=np.float64)


def reference_loop(reference: str, loops: set[int]) -> int | None:
    """The loop each window is compared with for ``--drift-reference`` ``first`` (the earliest
    loop) or a loop index; None for ``previous`` (each loop's own previous one)."""
    if reference == "previous":
        return None
    return min(loops) if reference == "first" else int(reference)


def _paired(
    series: list[dict[str, Any]], key: str, first: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float | None]:
    """(index in ``series``, hours since the reference window at the same position, value minus
    that window's, the first loop's median level) of every window with such a reference: the
    window at the same position in loop ``first``, or (None) in the latest loop before its own."""
    by_pos: dict[int, list[dict[str, Any]]] = {}
    for r in series:
        if r.get(key) is not None:
            by_pos.setdefault(r["position"], []).append(r)
    lowest = min((r["loop"] for r in series), default=0) if first is None else first
    levels = [float(r[key]) for r in series if r["loop"] == lowest and r.get(key) is not None]
    idx, x, y = [], [], []
    for i, r in enumerate(series):
        if r.get(key) is None:
            continue
        same = by_pos[r["position"]]
        if first is None:
            before = [b for b in same if b["loop"] < r["loop"]]
            base = max(before, key=lambda b: b["loop"]) if before else None
        else:
            base = next((b for b in same if b["loop"] == first), None)
        if base is None or base is r:
            continue
        idx.append(i)
        x.append((r["t_s"] - base["t_s"]) / 3600.0)
        y.append(float(r[key]) - float(base[key]))
    level = float(np.median(levels)) if levels else None
    return np.array(idx, dtype=np.int64), np.array(x), np.array(y), level


def _trend(
    series: list[dict[str, Any]],
    key: str,
    paired: bool,
    min_change_pct: float,
    max_pairs: int = MAX_PAIRS,
    reference: str = "first",
) -> dict[str, Any] | None:
    """One metric's slope, interval, level and start; None when it has too few windows."""
    rolling = paired and reference == "previous"
    if paired:
        idx, x, y, level = _paired(series, key, reference_loop(reference, {r["loop"] for r in series}))
        if int((x != 0).sum()) < MIN_WINDOWS:
            return None
    else:
        t = np.array([r["t_s"] for r in series]) / 3600.0
        y, _ = load_adjusted(t, _values(series, key), [_values(series, k) for k in OFFERED])
        idx = np.flatnonzero(~np.isnan(y))
        x, y = t[idx], y[idx]
        if x.size < MIN_WINDOWS:
            return None
        level = float(np.median(y[: max(3, x.size // 4)]))
    # rolling: each window's own slope against the previous loop's (one pair each), their median
    fit = median_interval(y / x, CONFIDENCE) if rolling else theil_sen(x, y, CONFIDENCE, max_pairs)
    if fit is None:
        return None
    tt = np.array([series[i]["t_s"] for i in idx])
    if rolling:
        span_h = float(tt.max() - min(r["t_s"] for r in series)) / 3600.0
    else:
        span_h = float(x.max() - x.min()) if not paired else float(np.abs(x).max())
    change = abs(fit.slope) * span_h
    big = change >= (min_change_pct / 100.0) * abs(level) if level else change > 0.01
    drifting = fit.excludes_zero and big
    order = np.argsort(tt, kind="stable")  # (the start is searched in run time, paired or not)
    # (rolling: the increments summed in run time draw the drift's curve, flat before it started)
    shape = np.cumsum(y[order]) if rolling else y[order]
    start = int(idx[order][change_start(tt[order], shape)]) if drifting else None
    return {
        "slope_per_hour": fit.slope,
        "interval_per_hour": [fit.low, fit.high],
        "slope_percent_per_hour": _pct(fit.slope, level),
        "interval_percent_per_hour": [_pct(fit.low, level), _pct(fit.high, level)] if level else None,
        "level": level,
        "windows": fit.n,
        "drifting": bool(drifting),
        "started_window": None if start is None else series[start].get("window", start),
        "started_at_s": None if start is None else series[start]["t_s"],
    }


def _pct(v: float, level: float | None) -> float | None:
    """``v`` as a percentage of ``level`` (None without a level)."""
    return 100.0 * v / abs(level) if level else None


def judge_drift(
    series: list[dict[str, Any]],
    *,
    window_s: float,
    min_change_pct: float = 10.0,
    max_lag_ms: float | None = None,
    max_pairs: int = MAX_PAIRS,
    reference: str = "first",
) -> dict[str, Any]:
    """The ``drift`` section from ``DriftFold.series()`` (module docstring). A window whose
    dispatch lag p99 is above ``max_lag_ms`` is left out of the trends (``lagging``: the replayer's
    host was the bottleneck then, and its latencies measure it, not the server). ``max_pairs``:
    the most pairs of windows each trend is fitted on (``trend.theil_sen``). ``reference``
    (``--drift-reference``, with loops): ``first``, ``previous`` or a loop index (``REFERENCES``)."""
    for i, r in enumerate(series):
        r["window"] = i
        lag = r.get("dispatch_lag_p99_ms")
        r["lagging"] = bool(max_lag_ms is not None and lag is not None and lag > max_lag_ms)
    all_series, series = series, [r for r in series if not r["lagging"]]
    loops = {r["loop"] for r in series}
    paired = len(loops) > 1
    sec: dict[str, Any] = {
        "window_s": window_s,
        "windows": len(all_series),
        "windows_lagging": len(all_series) - len(series),
        "method": _method(reference) if paired else "load-adjusted",
        "reference": reference if paired else None,
        "confidence": CONFIDENCE,
        "min_change_pct": min_change_pct,
        "metrics": {},
        "drifting": [],
        "improving": [],
    }
    for key, unit, worse in TRENDED:
        tr = _trend(series, key, paired, min_change_pct, max_pairs, reference)
        if tr is None:
            continue
        tr["unit"] = unit
        tr["direction"] = "worse" if tr["slope_per_hour"] * worse > 0 else "better"
        sec["metrics"][key] = tr
        if tr["drifting"] and tr["direction"] == "better":  # (a trend, but not a degradation)
            tr["drifting"] = False
            tr["improving"] = True
            sec["improving"].append(key)
        elif tr["drifting"]:
            sec["drifting"].append(key)
    if not sec["metrics"]:
        sec["verdict"] = "too_short"
        sec["reason"] = "; ".join(  # (printed in parentheses by drift_lines: none inside)
            [f"{count(len(series), 'window')} of {plain(window_s)} s, at least {MIN_WINDOWS} are needed"]
            + (
                [f"{len(all_series) - len(series):,} more left out: the replay lagged"]
                if len(all_series) > len(series)
                else []
            )
            + (["paired across loops: too few after the first loop"] if paired else [])
            + (
                [f"--drift-reference {reference}: no such loop"]
                if paired and reference.isdigit() and int(reference) not in loops
                else []
            )
        )
    else:
        sec["verdict"] = "drifting" if sec["drifting"] else "stable"
    sec["series"] = all_series
    return sec


def _method(reference: str) -> str:
    if reference == "previous":
        return "paired across loops: same trace position in the previous loop"
    if reference == "first":
        return "paired across loops: same trace position in the first loop"
    return f"paired across loops: same trace position in loop {reference}"


def drift_lines(sec: dict[str, Any] | None) -> list[str]:
    """The verdict as printed at the end of a run."""
    if not sec:
        return []
    if sec["verdict"] == "too_short":
        return [f"Drift: too short ({sec.get('reason', '')})"]
    if "windows" not in sec:  # (the verdict could not be computed: its error)
        return [f"Drift: {sec['verdict'].replace('_', ' ')} ({sec.get('error', '')})"]
    n, window_s = count(sec["windows"], "window"), plain(sec["window_s"])
    lines = [f"Drift: {sec['verdict']} ({n} of {window_s} s, {sec['method']})"]
    if sec.get("improving"):
        lines.append(f"  improving (a trend for the better, not drift): {', '.join(sec['improving'])}")
    for key in sec.get("drifting", []):
        m = sec["metrics"][key]
        lo, hi = m["interval_per_hour"]
        pct = m.get("slope_percent_per_hour")
        lines.append(
            f"  {key}: {plain(m['slope_per_hour'], signed=True)} {m['unit']}/h "
            f"[{plain(lo, signed=True)}, {plain(hi, signed=True)}]"
            + (f" ({pct:+,.1f} %/h)" if pct is not None else "")
            + f", {m['direction']}, from window {m['started_window']}{_into_run(m.get('started_at_s'))}"
        )
    return lines


def _into_run(t_s: float | None) -> str:
    """`` (2.5 h into the run)``: when a window (its middle) was, on the run's time axis."""
    if t_s is None:
        return ""
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if t_s >= size:
            return f" ({t_s / size:,.1f} {unit} into the run)"
    return f" ({t_s:,.1f} s into the run)"


__all__ = ["drift_lines", "judge_drift"]
