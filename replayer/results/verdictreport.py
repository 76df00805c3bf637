"""The report's verdicts (``replayer report``): the fidelity verdict and its reasons in words, and
the drift windows drawn, one figure per metric that drifts (TTFT p50 when none does): each
window's value over the run's time and the trend line (the Theil-Sen slope through the windows'
median offset); the report marks the loop boundaries and the run's other events on them, as on
its other time axes (``replayer.results.reportmarks``). Pure: figure specs as
``report.figure_specs`` has them, drawn by ``report.draw``."""

from __future__ import annotations

import html
from typing import Any

import numpy as np

from replayer.results.numtext import plain


def verdicts_html(summary: dict[str, Any]) -> str:
    """One short section: each verdict, the fidelity reasons and notes, the drifting metrics."""
    fid, drift = summary.get("fidelity"), summary.get("drift")
    if not fid and not drift:
        return ""
    items = []
    if fid:
        why = fid.get("reasons", []) if fid.get("verdict") == "not_faithful" else []
        items.append(
            f"<li>Fidelity: <b>{html.escape(fid['verdict'].replace('_', ' '))}</b>"
            + "".join(f"<br>{html.escape(r)}" for r in why + fid.get("notes", []))
            + "</li>"
        )
    if drift:
        text = drift["verdict"].replace("_", " ")
        detail = drift.get("reason") or ", ".join(drift.get("drifting", []))
        items.append(f"<li>Drift: <b>{html.escape(text)}</b>{': ' + html.escape(detail) if detail else ''}</li>")
    return "<section class='verdicts'><h2>Fidelity and drift</h2><ul>" + "".join(items) + "</ul></section>"


def drift_specs(summary: dict[str, Any]) -> list[dict]:
    """Figure specs of the drift windows (module docstring); [] without windows."""
    drift = summary.get("drift") or {}
    series = drift.get("series") or []
    if not series:
        return []
    metrics = drift.get("metrics") or {}
    shown = list(drift.get("drifting") or []) or ["ttft_p50_ms"]
    t = np.array([r["t_s"] for r in series], dtype=np.float64)
    specs = []
    for key in shown:
        y = np.array([np.nan if r.get(key) is None else float(r[key]) for r in series], dtype=np.float64)
        if np.isnan(y).all():
            continue
        out = [{"name": f"{key} per window", "mode": "markers", "line_shape": None, "x": t, "y": y}]
        fit = metrics.get(key)
        if fit is not None:
            slope_s = fit["slope_per_hour"] / 3600.0
            offset = float(np.nanmedian(y - slope_s * t))
            out.append(
                {
                    "name": f"trend {plain(fit['slope_per_hour'], signed=True)} {fit['unit']}/h",
                    "mode": "lines",
                    "line_shape": "linear",
                    "x": t,
                    "y": offset + slope_s * t,
                }
            )
        specs.append(
            {
                "title": f"Drift: {key} per {drift.get('window_s', 0):g} s window",
                "x_title": "run time (s)",
                "y_title": key,
                "x_type": "linear",
                "y_type": "linear",
                "series": out,
            }
        )
    return specs


__all__ = ["drift_specs", "verdicts_html"]
