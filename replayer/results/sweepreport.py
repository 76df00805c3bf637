"""The sweep's HTML page (``replayer sweep``'s ``sweep.json``): attainment and latency per speed-up.

Drawn like the run report (``replayer.results.report``'s plotly figures and page), from
``sweep_figure_specs`` (pure, so a test can check what each plot shows without a browser).
"""

from __future__ import annotations

import html
import os

import numpy as np

from replayer.results.report import _page, draw
from replayer.results.reportparts import number

_SWEEP_LATENCIES = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("E2E", "e2el_ms"))


def sweep_figure_specs(sweep: dict) -> list[dict]:
    """The data behind the sweep page's figures (pure; ``figure_specs``' shape), each against
    the offered load (requests/s) of the sweep's points (``replayer.run.sweep``'s ``sweep.json``):
    goodput, throughput and the rate achieved over the steady window, SLO attainment (over the
    steady window, which a point is judged on; over the whole run, overall and per bound; and
    ``--min-attainment``),
    TTFT/TPOT/E2E p50 and p99, dispatch lag p50 and p99 (and the bound past which the replayer
    is behind). Points without an offered load are left out."""
    pts = [p for p in sweep.get("points", []) if p.get("offered_rps")]
    x = np.array([p["offered_rps"] for p in pts], dtype=np.float64)

    def col(key: str) -> np.ndarray:
        return np.array([np.nan if p.get(key) is None else p[key] for p in pts], dtype=np.float64)

    def window_col(key: str) -> np.ndarray:
        """``key`` of each point's steady window (NaN: no window or no value)."""
        vals = [(p.get("steady_window") or {}).get(key) for p in pts]
        return np.array([np.nan if v is None else v for v in vals], dtype=np.float64)

    def series(name: str, y, mode: str = "lines+markers", xs=None) -> dict:
        return {
            "name": name,
            "mode": mode,
            "line_shape": "linear",
            "x": x if xs is None else np.asarray(xs),
            "y": np.asarray(y, dtype=np.float64),
        }

    def spec(title, y_title, ss, y_type="linear") -> dict:
        return {
            "title": title,
            "x_title": "offered load (requests/s)",
            "y_title": y_title,
            "x_type": "log",
            "y_type": y_type,
            "series": ss,
        }

    ends = [x.min(), x.max()] if x.size else []
    bounds = list(sweep.get("goodput_slos_ms") or {})
    return [
        spec(
            "Goodput and throughput vs offered load",
            "requests/s",
            [
                series("request goodput (met every bound)", col("request_goodput")),
                series("request throughput (completed)", col("request_throughput")),
                series("achieved over the steady window", col("achieved_rps")),
                series("offered", x, mode="lines"),
            ],
        ),
        spec(
            "SLO attainment vs offered load",
            "fraction of judged requests",
            [
                # the steady window's attainment is what a point is judged on; the whole run's beside it
                series("every bound, steady window (judged)", window_col("slo_attainment")),
                series("every bound, whole run", col("slo_attainment")),
                *(
                    series(f"{b} <= {sweep['goodput_slos_ms'][b]:g} ms, whole run", col(f"slo_attainment_{b}"))
                    for b in bounds
                ),
                series(
                    f"--min-attainment {sweep.get('min_attainment', 0.9):g}",
                    [sweep.get("min_attainment", 0.9)] * len(ends),
                    mode="lines",
                    xs=ends,
                ),
            ],
        ),
        *(
            spec(
                f"{label} vs offered load",
                "ms",
                [series(f"{label} p50", col(f"median_{key}")), series(f"{label} p99", col(f"p99_{key}"))],
                y_type="log",
            )
            for label, key in _SWEEP_LATENCIES
        ),
        spec(
            "Dispatch lag vs offered load (the replayer's own delay)",
            "ms",
            [
                series("dispatch lag p50", col("dispatch_lag_p50_ms")),
                series("dispatch lag p99", col("dispatch_lag_p99_ms")),
                series(
                    "replayer behind above",
                    [sweep.get("max_dispatch_lag_p99_ms", 50.0)] * len(ends),
                    mode="lines",
                    xs=ends,
                ),
            ],
        ),
    ]


def _window(p: dict) -> str:
    """A point's steady window, ``START-END s of SPAN s`` (or why there is none)."""
    w = p.get("steady_window")
    if not w:
        return "none"
    if w["too_short"]:
        e2e = (w["median_e2el_ms"] or 0) / 1e3
        return f"too short: {max(w['window_s'], 0):.2f} s of a {w['span_s']:.2f} s span, median E2E {e2e:.2f} s"
    return f"{w['start_s']:.2f}-{w['end_s']:.2f} s of {w['span_s']:.2f} s"


def _points_table(sweep: dict) -> str:
    cols = (
        ("index", "point"),
        ("speedup", "speed-up"),
        ("offered_rps", "offered req/s"),
        ("window", "steady window"),
        ("window.offered_rps", "offered req/s (window)"),
        ("achieved_rps", "achieved req/s (window)"),
        ("window.slo_attainment", "attainment (window)"),
        ("window.request_goodput", "goodput req/s (window)"),
        ("slo_attainment", "attainment (run)"),
        ("p99_ttft_ms", "TTFT p99 ms"),
        ("p99_tpot_ms", "TPOT p99 ms"),
        ("p99_e2el_ms", "E2E p99 ms"),
        ("dispatch_lag_p99_ms", "lag p99 ms"),
        ("max_concurrent_requests", "peak in flight"),
        ("status", "status"),
        ("results", "results folder"),
    )
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in cols)

    def cell(p: dict, k: str) -> str:
        if k == "window":
            return _window(p)
        v = (p.get("steady_window") or {}).get(k[7:]) if k.startswith("window.") else p.get(k)
        return "n/a" if v is None else f"{v:.1%}" if k.endswith("slo_attainment") else number(v)

    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell(p, k))}</td>" for k, _ in cols) + "</tr>"
        for p in sweep.get("points", [])
    )
    return f"<table class='summary'><tr>{head}</tr>{rows}</table>"


def _rule(sweep: dict) -> str:
    """The rule a point held by, in words (docs/sweep.md)."""
    rule = sweep.get("steady_rule") or {}
    frac, achieved = rule.get("transient_fraction", 0.1), rule.get("min_achieved_fraction", 0.9)
    return (
        f"A point holds when, over its steady window, at least {sweep.get('min_attainment', 0.9):.0%} of the "
        f"judged requests due in it met every bound and the server completed at least {achieved:.0%} of the "
        f"requests offered in it (achieved vs offered). The steady window leaves out a warm-up and a cool-down, "
        f"each {frac:.0%} of the offered span and at least the point's median E2E; a window shorter than the "
        "median E2E is too short to judge (the load was a burst, not a rate)."
    )


def render_sweep_html(sweep: dict, asset_dir: str | None = None) -> str:
    """The sweep page (``replayer.run.sweep``'s ``sweep.json``) as one self-contained HTML string:
    the verdict (the highest speed-up that held, why the sweep stopped), the points, the plots."""
    held = sweep.get("highest_held_speedup")
    slos = " ".join(f"{k}&lt;={v:g} ms" for k, v in (sweep.get("goodput_slos_ms") or {}).items())
    verdict = (
        f"the highest speed-up that held: <b>{held:g}x</b> "
        f"({number(sweep.get('highest_held_offered_rps') or 0)} requests/s offered, "
        f"{number(sweep.get('highest_held_achieved_rps') or 0)} achieved over its steady window, "
        f"goodput {number(sweep.get('highest_held_request_goodput') or 0)} requests/s over the whole run)"
        if held is not None
        else "<b>no speed-up held</b>"
    )
    behind = [p for p in sweep.get("points", []) if p.get("replayer_behind")]
    at = ", ".join(f"{p['speedup']:g}x" for p in behind)
    note = (
        f"<p>The replayer itself fell behind at {at}: those points measure the client, not the server.</p>"
        if behind
        else ""
    )
    intro = (
        f"<p>trace: {html.escape(str(sweep.get('trace')))} · target: {html.escape(str(sweep.get('target')))} · "
        f"SLO: {slos} · prefix cache between points: {html.escape(str(sweep.get('prefix_cache')))}</p>"
        f"<p>{_rule(sweep)}</p>"
        f"<h2>Verdict</h2><p>{verdict}; stopped: {html.escape(str(sweep.get('stop_reason')))}</p>{note}"
        f"<h2>Points</h2>{_points_table(sweep)}"
    )
    return _page("replayer sweep", "replayer sweep", intro, draw(sweep_figure_specs(sweep)), asset_dir=asset_dir)


def write_sweep_report(sweep: dict, output: str) -> str:
    """Write the sweep page to ``output``; returns its path."""
    text = render_sweep_html(sweep, os.path.dirname(os.path.abspath(output)))
    with open(output, "w", encoding="utf-8") as f:
        f.write(text)
    return output


# --------------------------------------------------------------------------------------------
# compare


#: (key, label, better) - better: "lower", "higher" or "" (no judgement)
