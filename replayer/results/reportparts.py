"""Parts of the HTML report that say what the run was at a glance (issue 47): the verdict line at
the top, readable log axes, charts only for what the run had, and plotly.js written once beside
the report instead of inlined in every page (the run's events on the time axes:
``replayer.results.reportmarks``).

Pure functions of the summary and the figure specs (``report.figure_specs``' shape), but
``plotly_script``, which writes the shared script file.
"""

from __future__ import annotations

import html
import math
import os

import numpy as np

__all__ = [
    "PLOTLY_FILE",
    "axis_layout",
    "drop_empty",
    "plotly_script",
    "verdict_line",
]

#: the plotly.js bundle, written beside the report (one copy per folder, shared by its pages)
PLOTLY_FILE = "plotly.min.js"


def _pct(v: object) -> str:
    return f"{v:.1%}" if isinstance(v, (int, float)) else "n/a"


def _section_word(section: object) -> str | None:
    """A verdict-like section's word (``verdict``, ``status`` or ``ok``), None when it has none."""
    if not isinstance(section, dict):
        return None
    for key in ("verdict", "status"):
        if isinstance(section.get(key), str):
            return section[key]
    if isinstance(section.get("ok"), bool):
        return "ok" if section["ok"] else "not ok"
    return None


def verdict_parts(summary: dict) -> list[tuple[str, bool | None]]:
    """The run's verdicts as (text, good): requests, SLOs (with ``--goodput``), the fidelity and
    drift sections when the summary has them, a stop or unwritten results; ``good`` None where
    the part judges nothing."""
    completed, failed = summary.get("completed") or 0, summary.get("failed") or 0
    ended = completed + failed
    parts: list[tuple[str, bool | None]] = []
    if summary.get("nothing_measured"):
        parts.append(("nothing measured: every request that ended failed", False))
    else:
        parts.append((f"{completed:,} of {ended:,} requests succeeded" if ended else "no request ended", failed == 0))
    if summary.get("goodput_slos_ms") or summary.get("slo_attainment") is not None:
        att = summary.get("slo_attainment")
        parts.append((f"SLO attainment {_pct(att)}", None if att is None else att >= 0.9))
    for name in ("fidelity", "drift"):
        word = _section_word(summary.get(name))
        if word is not None:
            parts.append((f"{name}: {word}", word.lower() in ("ok", "pass", "passed", "held", "none", "faithful")))
    if summary.get("stop_signal") or summary.get("stopped_early"):
        parts.append((f"stopped early ({summary.get('stop_signal') or '/stop'})", None))
    if summary.get("results_not_written") or summary.get("summary_not_written"):
        parts.append(("results not all written", False))
    return parts


def verdict_line(summary: dict) -> str:
    """The one line at the top of the report: the verdicts (``verdict_parts``) joined, each
    coloured (green good, red not, plain when it judges nothing)."""
    colour = {True: "#1a7f37", False: "#cf222e", None: "inherit"}
    cells = " · ".join(
        f"<span style='color:{colour[good]}'>{html.escape(text)}</span>" for text, good in verdict_parts(summary)
    )
    return f"<p class='verdict-line'><b>Verdict:</b> {cells}</p>"


def axis_layout(kind: str) -> dict:
    """Plotly axis settings for ``kind`` ("linear" or "log"): a log axis labelled at each decade
    only (1, 10, 100: plotly labels in-between ticks "2, 5" with no decade by default)."""
    if kind != "log":
        return {"type": kind}
    return {"type": "log", "dtick": 1, "exponentformat": "power", "minor": {"ticks": "outside", "showgrid": True}}


def _zero(series: dict) -> bool:
    y = np.asarray(series["y"], dtype=np.float64)
    return not len(y) or not np.nansum(np.abs(y)) > 0


def drop_empty(specs: list[dict]) -> list[dict]:
    """The specs less those whose every series is all zero (or empty): a chart only for what the
    run had (no image-cache chart of zeros for a text-only run). A zero series beside others stays
    (no request waiting is worth seeing beside those running)."""
    return [sp for sp in specs if not all(_zero(se) for se in sp["series"])]


def plotly_script(folder: str) -> str:
    """Write plotly.js as ``folder/plotly.min.js`` (unless the same is there) and return the
    script tag that loads it: the page opens offline, and a folder of reports holds one copy of
    the library (~4.6 MB) instead of one per page."""
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    path = os.path.join(folder, PLOTLY_FILE)
    try:
        same = os.path.getsize(path) == len(js.encode("utf-8"))
    except OSError:
        same = False
    if not same:
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(js)
        os.replace(tmp, path)
    return f'<script type="text/javascript" src="{PLOTLY_FILE}"></script>'


def number(v: float | int) -> str:
    """One number format for the summary table: thousands separators; a whole float as an int
    (a counter's delta), 3 decimals from 1 up, 4 significant digits below."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int) or (math.isfinite(v) and v == int(v)):
        return f"{int(v):,}"
    return f"{v:,.3f}" if abs(v) >= 1 else f"{v:.4g}"
