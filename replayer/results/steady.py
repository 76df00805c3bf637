"""A sweep point's steady window and its judgement: did the server carry the load it was offered
while meeting the SLO, or did a short burst only look as if it did? Pure functions over
per-request columns (``due_ns``, ``end_ns``, ``outcome``, ``slo_met``, ``e2e_ms``), so the rule is
tested on scripted rows without a server or an event loop; ``replayer sweep`` reads the columns
from each point's results files.

The rule (docs/sweep.md):

- **The offered span** runs from the first to the last due time of the point's requests.
- **Warm-up and cool-down**: each lasts ``TRANSIENT_FRACTION`` of the span (as guidellm's
  ``--warmup``/``--cooldown`` fractions of a benchmark) and at least the point's median E2E:
  by Little's law the number of requests in flight reaches its steady level only about one
  request lifetime after the load starts, and drains for as long after it stops.
- **The steady window** is what is left between them. Requests *due* in it are the ones judged
  (attainment, goodput); its **offered** rate counts the requests due in it, its **achieved** rate
  the requests that *completed* (ended with ``success``) in it, both per second of the window.
- **Too short** when the window is shorter than the latencies it judges (the median E2E): a
  load whose burst ends before its requests do says nothing about the rate it was sent at. With
  the transients above, a point needs an offered span of at least three median E2Es.
- **Not sustained** when the achieved count is below ``MIN_ACHIEVED_FRACTION`` of the offered
  count, less one request (the granularity of counting): the server fell behind the offered
  load over the window (its queue grew), whatever the latencies said so far.

``judge_point`` gives a point's status from its ``summary.json`` and this window: ``error``,
``replayer_behind``, ``stopped``, ``no_verdict``, ``missed``, ``window_too_short``,
``not_sustained`` or ``held``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: warm-up and cool-down, each this fraction of the offered span (at least the median E2E)
TRANSIENT_FRACTION = 0.1
#: a point is sustained when the window's achieved count is at least this fraction of its offered count
MIN_ACHIEVED_FRACTION = 0.9
#: the columns ``steady_window`` reads
COLUMNS = ("due_ns", "end_ns", "outcome", "slo_met", "e2e_ms")


def _int_ns(values: Any) -> np.ndarray:
    """An int64 ns array with None as a sentinel far in the future (never inside a window)."""
    a = np.asarray([np.iinfo(np.int64).max if v is None else v for v in values], dtype=np.int64)
    return a


def steady_window(due_ns: Any, end_ns: Any, outcome: Any, slo_met: Any, e2e_ms: Any) -> dict[str, Any] | None:
    """The steady window of one point's requests (one row each; any order): None for fewer than
    2 due times or a span of 0. Times in the result are seconds since the first due time.

    - ``span_s``, ``warmup_s``, ``cooldown_s``, ``start_s``, ``end_s``, ``window_s`` (can be <= 0);
    - ``median_e2el_ms`` (completed requests; None when none completed);
    - ``due``, ``completed``: requests due / completed in the window; ``offered_rps``,
      ``achieved_rps``: the same per second of the window (None when the window is empty);
    - ``judged``, ``met``, ``slo_attainment`` (met / judged of the requests due in the window;
      None when none was judged), ``request_goodput`` (requests due in the window that met
      the SLO, per second of the window);
    - ``too_short``, ``sustained``: the rule of the module docstring.
    """
    due = np.asarray(list(due_ns), dtype=np.int64)
    if due.size < 2:
        return None
    t0, t1 = int(due.min()), int(due.max())
    span = (t1 - t0) / 1e9
    if span <= 0:
        return None
    end = _int_ns(end_ns)
    ok = np.asarray([o == "success" for o in outcome], dtype=bool)
    met_col = list(slo_met)
    e2e = np.asarray([np.nan if v is None else v for v in e2e_ms], dtype=np.float64)
    done_e2e = e2e[ok & ~np.isnan(e2e)]
    median_e2e_ms = float(np.median(done_e2e)) if done_e2e.size else None
    transient = max(TRANSIENT_FRACTION * span, (median_e2e_ms or 0.0) / 1e3)
    start_s, end_s = transient, span - transient
    window = end_s - start_s
    lo, hi = t0 + int(round(start_s * 1e9)), t0 + int(round(end_s * 1e9))
    in_window = (due >= lo) & (due <= hi) if window > 0 else np.zeros(due.size, dtype=bool)
    n_due = int(in_window.sum())
    n_done = int((ok & (end >= lo) & (end <= hi)).sum()) if window > 0 else 0
    judged = [m for m, w in zip(met_col, in_window.tolist()) if w and m is not None]
    n_met = sum(1 for m in judged if m)
    too_short = window <= 0 or window < (median_e2e_ms or 0.0) / 1e3
    return {
        "span_s": span,
        "warmup_s": transient,
        "cooldown_s": transient,
        "start_s": start_s,
        "end_s": end_s,
        "window_s": window,
        "median_e2el_ms": median_e2e_ms,
        "due": n_due,
        "completed": n_done,
        "offered_rps": n_due / window if window > 0 else None,
        "achieved_rps": n_done / window if window > 0 else None,
        "judged": len(judged),
        "met": n_met,
        "slo_attainment": n_met / len(judged) if judged else None,
        "request_goodput": n_met / window if window > 0 else None,
        "too_short": too_short,
        "sustained": not too_short and n_done >= MIN_ACHIEVED_FRACTION * n_due - 1,
    }


def judge_point(summary: dict | None, window: dict | None, min_attainment: float, max_lag_ms: float) -> tuple[str, str]:
    """(status, why) of a sweep point from its ``summary.json`` (None: the run wrote none) and its
    ``steady_window`` (None: fewer than 2 requests). The replayer's own lag is checked first: a
    point it fell behind on is never blamed on the server. A whole-run attainment below the bound
    is a miss even when the window is too short to judge (the transients it leaves out are the
    easy part of a load); otherwise attainment is judged over the window, and a point holds only
    when the window is long enough and the server carried its offered rate."""
    if summary is None:
        return "error", "the run wrote no summary.json: see its run.log"
    lag = summary.get("dispatch_lag_p99_ms")
    if lag is not None and lag > max_lag_ms:
        return "replayer_behind", (
            f"the replayer fell behind (dispatch lag p99 {lag:.0f} ms > {max_lag_ms:g} ms): "
            "its latencies include client delay; use --workers"
        )
    if summary.get("stopped_early"):
        return "stopped", f"the run was stopped ({summary.get('stop_signal') or '/stop'})"
    whole = summary.get("slo_attainment")
    if whole is None:
        return "no_verdict", "no request was judged against the SLO"
    if whole < min_attainment:
        return "missed", f"attainment {whole:.1%} < {min_attainment:.0%}"
    if window is None or window["too_short"]:
        why = (
            "fewer than 2 requests were due"
            if window is None
            else f"the steady window ({max(window['window_s'], 0):.2f} s of a {window['span_s']:.2f} s offered span, "
            f"after a warm-up and before a cool-down of {window['warmup_s']:.2f} s each) is shorter than the "
            f"median E2E it would judge ({(window['median_e2el_ms'] or 0) / 1e3:.2f} s)"
        )
        return "window_too_short", f"{why}: the load was never steady; offer more requests (--max-requests, --duration)"
    att = window["slo_attainment"]
    if att is None:
        return "no_verdict", "no request due in the steady window was judged against the SLO"
    if att < min_attainment:
        return "missed", f"attainment {att:.1%} < {min_attainment:.0%} over the steady window"
    if not window["sustained"]:
        return "not_sustained", (
            f"achieved {window['achieved_rps']:.2f} of {window['offered_rps']:.2f} req/s offered over the steady "
            f"window (< {MIN_ACHIEVED_FRACTION:.0%}): the server fell behind the load"
        )
    return "held", f"attainment {att:.1%} >= {min_attainment:.0%} over the steady window"
