"""Offline HTML report of one run's results folder (never imported by the daemon).

``replayer report RESULTS [-o report.html]`` reads every results file of ``RESULTS`` (rolled
files and parts, a resumed run's, or a ``--workers`` run's worker folders; schema in
``replayer/core/result.py``), ``RESULTS/summary.json`` (recomputed if missing) and, when present,
the target's metric samples (``RESULTS/target_metrics.parquet`` and parts a run still going or
killed left: ``replayer.observe.target_samples.read_samples``), and writes one self-contained HTML file (plotly.js inlined
once; no network needed to view it) with: arrivals due vs sent vs completed over time, latency
over time, latency CDFs, token throughput, dispatch lag, errors, and the target's metrics; the
run's events (loop boundaries, pauses, speed-up changes, ...) marked on every time axis
(``replayer.results.reportmarks``).
``replayer.results.sweepreport`` draws a sweep's page with the same figures and page; ``replayer compare``
is ``replayer.results.compare``'s.

The figures' data comes from ``figure_specs`` (pure: titles, axis titles and units, series
names and points), so a test can check what each plot shows without a browser; ``figures`` only
draws those specs with plotly. The target's samples (``save_samples``'s long format: one row per
scrape and raw series, ``metric`` naming it) are plotted per metric on the run's time axis:
gauges as scraped, counters as their increase per second, one figure per unit.

Results are read batch by batch, only the columns a plot needs (``replayer.results.reportdata``), so
memory does not grow with the run.
"""

from __future__ import annotations

import html
import os
import sys
from typing import Any

import numpy as np
import pandas as pd

from replayer.results.reportdata import MAX_POINTS, ReportData, axis_origin_wall_s, load_results, report_files
from replayer.results.reportmarks import add_marks, draw_marks, run_marks
from replayer.results.reportparts import axis_layout, drop_empty, number, plotly_script, verdict_line
from replayer.results.reportspans import span_specs, spans_section, write_split_csv
from replayer.results.spanjoin import SpansError, SpanSplit, read_spans, split_spans, split_text
from replayer.results.verdictreport import drift_specs, verdicts_html

#: a ``plotly.graph_objects.Figure`` (plotly ships no type hints)
Figure = Any


def figure_specs(data: ReportData, target: pd.DataFrame | None = None, t0_wall_s: float | None = None) -> list[dict]:
    """The data behind every figure of the report, as plain dicts (pure; tested without a
    browser): ``{"title", "x_title", "y_title", "x_type", "y_type", "series": [{"name", "mode",
    "line_shape", "x", "y"}]}`` with ``x``/``y`` NumPy arrays (``*_type``: "linear" or "log";
    ``mode``: "lines" or "markers"). ``data``: the requests folded (``load_results``); ``target``:
    the target's metric samples (``target_samples.read_samples``) or None; ``t0_wall_s``: the Unix
    time of the requests' time axis origin, so the target's samples share that axis."""
    x, bin_s = data.edges[:-1], data.bin_s
    specs: list[dict] = []

    def spec(title, x_title, y_title, series, x_type="linear", y_type="linear") -> None:
        specs.append(
            {
                "title": title,
                "x_title": x_title,
                "y_title": y_title,
                "x_type": x_type,
                "y_type": y_type,
                "series": series,
            }
        )

    def line(name, x, y, shape="linear") -> dict:
        return {"name": name, "mode": "lines", "line_shape": shape, "x": np.asarray(x), "y": np.asarray(y)}

    def dots(name, x, y) -> dict:
        return {"name": name, "mode": "markers", "line_shape": None, "x": np.asarray(x), "y": np.asarray(y)}

    spec(
        "Arrivals: due vs sent vs completed",
        "time since start (s)",
        "requests/s",
        [
            line(name, x, data.per_bin[key] / bin_s, shape="hv")
            for name, key in (("due (schedule)", "due"), ("sent", "sent"), ("completed", "completed"))
        ],
    )

    d = data.ok_sample.frame()
    if not len(d):
        d = pd.DataFrame({"sent_s": [], "ttft_ms": [], "e2e_ms": []})
    warm = d["warmup"].to_numpy(dtype=bool) if "warmup" in d else np.zeros(len(d), dtype=bool)
    kinds = (("ttft_ms", "TTFT"), ("e2e_ms", "E2E"))
    series = [dots(name, d["sent_s"][~warm], d[col][~warm] / 1e3) for col, name in kinds]
    if warm.any():  # warm-up requests: grey, apart (left out of every statistic)
        series += [
            {**dots(f"{n} (warm-up)", d["sent_s"][warm], d[c][warm] / 1e3), "color": "#aaaaaa"} for c, n in kinds
        ]
    spec("Latency over time (successful requests)", "send time (s)", "seconds", series, y_type="log")

    cdfs = {**data.latency, **(data.from_due if data.has_from_due else {})}
    spec(
        "Latency CDFs",
        "seconds",
        "fraction of samples",
        [line(name, *stat.cdf(MAX_POINTS)) for name, stat in cdfs.items()],
        x_type="log",
    )

    spec(
        "Token throughput",
        "completion time (s)",
        "tokens/s",
        [
            line(name, x, data.per_bin[key] / bin_s, shape="hv")
            for name, key in (
                ("completion tokens/s (server usage)", "completion_tokens"),
                ("prompt tokens/s (server usage)", "prompt_tokens"),
            )
        ],
    )

    d = data.sent_sample.frame()
    spec(
        "Dispatch lag",
        "due time (s)",
        "sent - due (ms)",
        [dots("lag", d["due_s"] if len(d) else [], d["dispatch_lag_ms"] if len(d) else [])],
    )

    if data.failed_by_kind:
        spec(
            "Unsuccessful requests by kind",
            "due time (s)",
            f"requests per {bin_s:g} s",
            [line(kind, x, data.failed_by_kind[kind], shape="hv") for kind in sorted(data.failed_by_kind)],
        )

    if target is not None and len(target):
        specs.extend(drop_empty(target_specs(target, t0_wall_s)))  # (issue 47: only what the run had)
    return specs


#: a target metric's unit on the plot: a gauge's as reported, a counter's as a rate per second.
#: Counters of tokens (vLLM's prefix-cache counters count tokens too) and of requests get figures
#: of their own: on one linear axis a few requests/s beside thousands of tokens/s read as 0.
def _target_unit(metric: str, kind: str) -> str:
    if kind == "gauge":
        return "fraction (0-1)" if metric.endswith("_perc") else "requests" if "num_requests" in metric else "value"
    if metric.endswith("_seconds_sum"):
        return "seconds/s"
    if "tokens" in metric or "prefix_cache" in metric:
        return "tokens/s"
    if "request" in metric or "preemption" in metric:
        return "requests/s"
    return "per second"


def target_specs(t: pd.DataFrame, t0_wall_s: float | None = None) -> list[dict]:
    """Figure specs (as ``figure_specs``) of the target's metric samples (``save_samples``'s long
    format: ``time_s``, ``metric``, ``labels``, ``kind``, ``value``): one figure per unit, one
    series per metric, its series (engines, label sets) combined at each scrape: summed, or
    averaged for a ``_perc`` fraction. A gauge is plotted as scraped; a counter as its increase
    per second between scrapes (a decrease, a server restart, leaves that interval out). ``x`` is
    seconds after ``t0_wall_s`` (default: the first scrape)."""
    if not {"metric", "value", "time_s"} <= set(t.columns) or not len(t):
        return []
    t = t.assign(kind=t["kind"] if "kind" in t.columns else "gauge")
    origin = t0_wall_s if t0_wall_s is not None else float(t["time_s"].min())
    by_unit: dict[str, list[dict]] = {}
    for (metric, kind), g in t.groupby(["metric", "kind"], sort=True):
        agg = "mean" if metric.endswith("_perc") else "sum"
        v = g.groupby("time_s")["value"].agg(agg).sort_index()
        x = v.index.to_numpy(np.float64) - origin
        y = v.to_numpy(np.float64)
        name = str(metric)
        if kind == "counter":
            dt, dv = np.diff(x), np.diff(y)
            keep = (dt > 0) & (dv >= 0)
            x, y = x[1:][keep], dv[keep] / dt[keep]
            name = name.removesuffix("_total")
        unit = _target_unit(str(metric), str(kind))
        by_unit.setdefault(unit, []).append({"name": name, "mode": "lines", "line_shape": "linear", "x": x, "y": y})
    return [
        {
            "title": f"Target server metrics: {unit}",
            "x_title": "time since start (s)",
            "y_title": unit,
            "x_type": "linear",
            "y_type": "linear",
            "series": series,
        }
        for unit, series in by_unit.items()
    ]


def figures(
    data: ReportData, target: pd.DataFrame | None = None, t0_wall_s: float | None = None
) -> list[tuple[str, Figure]]:
    """The report's plotly figures as (title, figure), drawn from ``figure_specs``."""
    return draw(figure_specs(data, target, t0_wall_s))


def draw(specs: list[dict]) -> list[tuple[str, Figure]]:
    """Plotly figures as (title, figure) of figure specs (``figure_specs``' shape; ``mode`` may
    also be "lines+markers"; a series' optional ``color`` colours its markers; a spec's optional
    ``marks``, the run's events, drawn by ``replayer.results.reportmarks.draw_marks``)."""
    import plotly.graph_objects as go

    out = []
    for sp in specs:
        f = go.Figure()
        for se in sp["series"]:
            kw = (
                {"marker": {"size": 4, "opacity": 0.6, **({"color": se["color"]} if "color" in se else {})}}
                if se["mode"] == "markers"
                else {"line_shape": se["line_shape"]}
            )
            f.add_trace(go.Scatter(x=se["x"], y=se["y"], mode=se["mode"], name=se["name"], **kw))
        f.update_layout(  # (a legend with one line too: plotly hides it, and the line goes unnamed)
            xaxis={"title": sp["x_title"], **axis_layout(sp["x_type"])},
            yaxis={"title": sp["y_title"], **axis_layout(sp["y_type"])},
            showlegend=True,
        )
        draw_marks(f, sp.get("marks", []))  # (the run's events: replayer.results.reportmarks)
        out.append((sp["title"], f))
    return out


#: summary entries left out of the report's table (raw per-series state a resumed run carries on)
_TABLE_SKIP = ("series_totals", "series")


def summary_rows(summary: dict, prefix: str = "") -> list[tuple[str, str]]:
    """The summary as (name, text) rows: nested dicts (``target_metrics``, ``errors_by_kind``)
    flattened to dotted names, numbers in one format (``_number``), None as "n/a", lists joined."""
    rows: list[tuple[str, str]] = []
    for k, v in summary.items():
        if k in _TABLE_SKIP:
            continue
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            rows.extend(summary_rows(v, name + ".") if v else [(name, "-")])
        elif v is None:
            rows.append((name, "n/a"))
        elif isinstance(v, (list, tuple)):
            rows.append(
                (
                    name,
                    ", ".join(
                        number(x) if not isinstance(x, dict) else " ".join(f"{a}={number(b)}" for a, b in x.items())
                        for x in v
                    )
                    or "-",
                )
            )
        else:
            rows.append((name, number(v)))
    return rows


def _summary_table(summary: dict) -> str:
    return (
        "<table class='summary'>"
        + "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in summary_rows(summary))
        + "</table>"
    )


def _verdict_section(summary: dict) -> str:
    """The verdict (``replayer.results.verdict.verdict_rows``) as the report's first section; "" without bounds."""
    from replayer.results.verdict import verdict_rows

    rows = verdict_rows(summary)
    if not rows:
        return ""
    cells = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return (
        "<section class='verdict'><h2>Verdict</h2><p>A request meets the SLO when it succeeded and every "
        "bound holds; failed requests count as missed, unknown ones are left out.</p>"
        f"<table class='summary'>{cells}</table></section>"
    )


def _page(
    title: str, heading: str, intro: str, figs: list[tuple[str, Figure]], tail: str = "", asset_dir: str | None = None
) -> str:
    """One HTML page: ``intro`` (HTML), the figures (div ids ``fig0``, ``fig1``...), then ``tail``
    (HTML). plotly.js is loaded from ``asset_dir/plotly.min.js`` (written there once: a report
    does not carry its own 4.6 MB copy), or inlined when ``asset_dir`` is None."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    parts = []
    for i, (fig_title, fig) in enumerate(figs):
        fig.update_layout(
            title=fig_title, height=420, margin={"l": 60, "r": 20, "t": 50, "b": 50}, template="plotly_white"
        )
        parts.append(
            f"<section class='plot'>{pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f'fig{i}')}</section>"
        )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
{plotly_script(asset_dir) if asset_dir is not None else f'<script type="text/javascript">{get_plotlyjs()}</script>'}
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}} table.summary{{border-collapse:collapse;font-size:13px}}
table.summary td,table.summary th{{border-bottom:1px solid #ddd;padding:2px 10px}} section.plot{{margin:1.5em 0}}</style></head>
<body><h1>{html.escape(heading)}</h1>{intro}
{"".join(parts)}
{tail}
</body></html>
"""


def _warmup_text(n: int) -> str:
    """The intro's word on the warm-up requests ("" when none)."""
    if not n:
        return ""
    return (
        f" ({n:,} of them warm-up: sent first, left out of the summary, the verdict and the latency "
        "distributions; grey in the latency plot)"
    )


def render_html(results_dir: str, spans: SpanSplit | None = None, asset_dir: str | None = None) -> str:
    """The report of ``results_dir`` as an HTML string (with ``spans``: the join with the
    server's spans, ``replayer.results.spanjoin``); plotly.js as ``_page`` loads it."""
    from replayer.observe.target_samples import read_samples

    data, summary, meta = load_results(results_dir)
    samples = read_samples(results_dir)
    target = samples.to_pandas() if samples is not None else None
    info = {k: meta.get(f"replayer.{k}") for k in ("version", "trace", "target", "model")}
    head = " · ".join(f"{k}: {html.escape(str(v))}" for k, v in info.items() if v)
    origin = axis_origin_wall_s(results_dir)
    intro = (
        verdict_line(summary)  # (issue 47: whether the run was good, in one line at the top)
        + f"<p>{head}</p><p>{len(data):,} requests scheduled{_sent_text(data)}{_warmup_text(data.warmup_rows)}"
        f"{_peak_text(summary, origin)}; results folder "
        f"{html.escape(os.path.abspath(results_dir))}</p>\n" + _verdict_section(summary)
    )
    specs = figure_specs(data, target, origin) + drift_specs(summary)  # (issue 45: the drift windows)
    marks = run_marks(summary, data.loop_starts, origin)  # the run's events, on every time axis
    add_marks(specs, marks)
    figs = draw(specs)
    intro += verdicts_html(summary)  # (issue 45: the fidelity and drift verdicts)
    if spans is not None:
        intro += spans_section(spans)
        split = span_specs(spans)
        if origin is not None and spans.t0_ns is not None:  # (its axis starts at the first traced send)
            add_marks(split, marks, spans.t0_ns / 1e9 - origin)
        figs = draw(split) + figs
    return _page(
        f"replayer report: {os.path.basename(os.path.abspath(results_dir))}",
        "replayer report",
        intro,
        figs,
        f"<h2>Summary</h2>{_summary_table(summary)}",
        asset_dir,
    )


def _sent_text(data) -> str:
    """ " (N sent)": the requests that went out (not-started ones are scheduled, never sent)."""
    sent = int(data.per_bin["sent"].sum())
    return f" ({sent:,} sent)" if sent != len(data) else ""


def _peak_text(summary: dict, origin_wall_s: float | None) -> str:
    """ ", at most N in flight at once (at T s)": the summary's exact peak concurrency, its time
    on the report's axis (the earliest run's anchor); "" when the summary has none."""
    n = summary.get("max_concurrent_requests")
    if n is None:
        return ""
    at_unix, at_s = summary.get("max_concurrent_requests_at_unix_s"), summary.get("max_concurrent_requests_at_s")
    if at_unix is not None and origin_wall_s is not None:
        at_s = at_unix - origin_wall_s
    return f", at most {n:,} in flight at once" + (f" (at {at_s:,.3f} s)" if at_s is not None else "")


def write_report(results_dir: str, output: str | None = None, spans: SpanSplit | None = None) -> str:
    """Write the report (default ``RESULTS/report.html``); returns its path. With ``spans``,
    the split per request goes to the output's ``.spans.csv`` too."""
    output = output or os.path.join(results_dir, "report.html")
    if spans is not None:
        write_split_csv(spans, os.path.splitext(output)[0] + ".spans.csv")
    text = render_html(results_dir, spans, os.path.dirname(os.path.abspath(output)))
    with open(output, "w", encoding="utf-8") as f:
        f.write(text)
    return output


# --------------------------------------------------------------------------------------------
# sweep


#: (summary key, label) of the latency figures of a sweep page: p50 and p99 of each


def main_report(results: str, output: str | None, spans_file: str | None = None) -> int:
    if not report_files(results):
        print(f"replayer report: error: no results files (requests*.parquet) in {results}", file=sys.stderr)
        return 2
    split = None
    if spans_file is not None:
        try:
            split = split_spans(read_spans(spans_file))
        except (OSError, SpansError) as e:
            print(f"replayer report: error: --spans: {e}", file=sys.stderr)
            return 2
        print(split_text(split))
    try:
        path = write_report(results, output, split)
    except OSError as e:
        print(f"replayer report: error: cannot write the report: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0
