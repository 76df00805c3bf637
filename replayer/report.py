"""Offline HTML report of one run's results folder (never imported by the daemon).

``replayer report RESULTS [-o report.html]`` reads every results file of ``RESULTS`` (rolled
files and parts, a resumed run's, or a ``--workers`` run's worker folders; schema in
``replayer/result.py``), ``RESULTS/summary.json`` (recomputed if missing) and, when present,
the target's metric samples (``RESULTS/target_metrics.parquet`` and parts a run still going or
killed left: ``replayer.target_metrics.read_samples``), and writes one self-contained HTML file (plotly.js inlined
once; no network needed to view it) with: arrivals due vs sent vs completed over time, latency
over time, latency CDFs, token throughput, dispatch lag, errors, and the target's metrics.
``write_sweep_report`` draws a sweep's page (``replayer sweep``'s ``sweep.json``) the same way.

The figures' data comes from ``figure_specs`` (pure: titles, axis titles and units, series
names and points), so a test can check what each plot shows without a browser; ``figures`` only
draws those specs with plotly. The target's samples (``save_samples``'s long format: one row per
scrape and raw series, ``metric`` naming it) are plotted per metric on the run's time axis:
gauges as scraped, counters as their increase per second, one figure per unit.

Results are read batch by batch, only the columns a plot needs (``ReportData``): time series are
binned counts, CDFs come from ``stats.Stat`` (exact, or sketched for long runs), scatter plots
show a uniform sample of at most ``MAX_POINTS`` requests, so memory does not grow with the run.
"""

from __future__ import annotations

import glob
import html
import json
import math
import os
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from .result import itl_samples

#: keep plots light (SVG): at most this many points per trace (uniform subsample)
MAX_POINTS = 5_000

#: the results columns the report reads, batch by batch (ITL lists only a batch at a time)
REPORT_COLUMNS = ["due_ns", "sent_ns", "end_ns", "outcome", "error_kind", "ttft_ms", "e2e_ms", "tpot_ms",
                  "dispatch_lag_ms", "completion_tokens", "prompt_tokens", "ttft_from_due_ms", "e2el_from_due_ms",
                  "itl_ms", "itl_counts"]




def report_files(results_dir: str) -> list[str]:
    """The results files of a folder (rolled files, parts), or of its ``worker-*`` folders (a
    ``--workers`` run), or of the folders a ``replayer merge -o`` folder was merged from (its
    summary's ``merged_from``: each path as given to merge, else a folder of that name beside
    the merged one, as in a Kubernetes run's ``run-START_AT/``). A damaged file is reported by
    name and left out."""
    from .recorder import open_file, result_files
    from .summary import read_summary

    files = result_files(results_dir)
    if not files:
        for d in sorted(glob.glob(os.path.join(results_dir, "worker-*"))):
            files += result_files(d)
    if not files:
        merged_from = read_summary(results_dir).get("merged_from") or []
        for d in merged_from:
            beside = os.path.join(os.path.dirname(os.path.abspath(results_dir)), os.path.basename(d.rstrip("/")))
            files += result_files(d) or result_files(beside)
    return [f for f in files if open_file(f) is not None]  # a damaged file is reported by name


class _Sample:
    """A uniform random sample of at most ``size`` rows of a stream of batches (the rows with
    the ``size`` smallest random keys), as numpy columns."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.rng = np.random.default_rng(seed)
        self.keys = np.zeros(0)
        self.cols: dict[str, np.ndarray] = {}

    def add(self, cols: dict[str, np.ndarray]) -> None:
        n = len(next(iter(cols.values())))
        keys = np.concatenate([self.keys, self.rng.random(n)])
        merged = {k: np.concatenate([self.cols[k], v]) if k in self.cols else v for k, v in cols.items()}
        keep = np.argpartition(keys, self.size)[: self.size] if keys.size > self.size else slice(None)
        self.keys = keys[keep]
        self.cols = {k: v[keep] for k, v in merged.items()}

    def frame(self) -> pd.DataFrame:
        order = np.argsort(self.cols.get("sent_s", np.zeros(0)), kind="stable") if self.cols else slice(None)
        return pd.DataFrame({k: v[order] for k, v in self.cols.items()})


class ReportData:
    """What the report plots, folded from the results one batch at a time (memory bounded
    whatever the number of rows or ITL samples): per-time-bin counts (arrivals due, sent,
    completed; server-reported tokens; unsuccessful requests by kind) over ``edges`` (s since
    the earliest run anchor), latency distributions as ``stats.Stat`` (CDFs: exact or sketched),
    and uniform samples of at most ``MAX_POINTS`` rows for the scatter plots."""

    def __init__(self, files: list[str]) -> None:
        from .stats import Stat
        from .merge import iter_on_one_axis

        self.rows = 0
        end = 1.0
        for b in iter_on_one_axis(files, ["due_ns", "end_ns"]):  # first pass: the time span
            self.rows += b.num_rows
            for col in b.columns:
                v = col.to_numpy(zero_copy_only=False).astype(np.float64)
                if (~np.isnan(v)).any():
                    end = max(end, float(np.nanmax(v)) / 1e9)
        self.bin_s = max(1.0, end / 300)
        self.edges = np.arange(0.0, end + self.bin_s, self.bin_s)
        zeros = lambda: np.zeros(self.edges.size - 1)  # noqa: E731
        self.per_bin = {k: zeros() for k in ("due", "sent", "completed", "completion_tokens", "prompt_tokens")}
        self.failed_by_kind: dict[str, np.ndarray] = {}
        self.latency = {k: Stat() for k in ("TTFT", "E2E", "TPOT", "ITL (token-weighted)")}
        self.from_due = {k: Stat() for k in ("TTFT from the due time", "E2E from the due time")}
        self.has_from_due = False  # the files have the from-due columns
        self.ok_sample, self.sent_sample = _Sample(MAX_POINTS, 0), _Sample(MAX_POINTS, 1)
        for b in iter_on_one_axis(files, REPORT_COLUMNS):
            self._add(b)

    def _bin(self, key: str, seconds: np.ndarray, weights: np.ndarray | None = None) -> None:
        keep = ~np.isnan(seconds)
        counts, _ = np.histogram(seconds[keep], bins=self.edges, weights=None if weights is None else weights[keep])
        self.per_bin[key] += counts

    def _add(self, b) -> None:
        import pyarrow.compute as pc

        f = lambda name: b.column(name).to_numpy(zero_copy_only=False).astype(np.float64)  # noqa: E731
        due, sent, end = f("due_ns") / 1e9, f("sent_ns") / 1e9, f("end_ns") / 1e9
        ok = pc.fill_null(pc.equal(b.column("outcome"), "success"), False).to_numpy(zero_copy_only=False)
        self._bin("due", due)
        self._bin("sent", sent)
        self._bin("completed", end[ok])
        for col in ("completion_tokens", "prompt_tokens"):
            self._bin(col, end[ok], np.nan_to_num(f(col)[ok]))
        bad = ~ok
        if bad.any():
            kinds = np.asarray(b.column("error_kind").to_pylist(), dtype=object)[bad]
            for kind in set(kinds.tolist()):
                counts, _ = np.histogram(due[bad][kinds == kind], bins=self.edges)
                self.failed_by_kind[str(kind)] = self.failed_by_kind.get(str(kind), 0) + counts
        ttft, e2e = f("ttft_ms")[ok], f("e2e_ms")[ok]
        self.latency["TTFT"].add(ttft / 1e3)
        self.latency["E2E"].add(e2e / 1e3)
        self.latency["TPOT"].add(f("tpot_ms")[ok] / 1e3)
        self.latency["ITL (token-weighted)"].add(itl_samples(b, ok) / 1e3)  # (either ITL form)
        if "ttft_from_due_ms" in b.schema.names:
            self.has_from_due = True
            self.from_due["TTFT from the due time"].add(f("ttft_from_due_ms")[ok] / 1e3)
            self.from_due["E2E from the due time"].add(f("e2el_from_due_ms")[ok] / 1e3)
        if ok.any():
            self.ok_sample.add({"sent_s": sent[ok], "ttft_ms": ttft, "e2e_ms": e2e})
        was_sent = ~np.isnan(sent)
        if was_sent.any():
            self.sent_sample.add({"sent_s": sent[was_sent], "due_s": due[was_sent],
                                  "dispatch_lag_ms": f("dispatch_lag_ms")[was_sent]})

    def __len__(self) -> int:
        return self.rows


def load_results(results_dir: str) -> tuple["ReportData", dict, dict]:
    """(the folded ``ReportData``, summary dict, parquet metadata dict of the first file) of a
    results folder: every results file (``report_files``), times rebased to the earliest run
    anchor (a resumed run or a worker has an anchor of its own; ``replayer.merge``). A folder
    without ``summary.json`` is summarized from its files (``summary.summarize_files``, judged
    by the run's own ``--goodput`` bounds from their metadata)."""
    from .summary import read_summary, summarize_files

    files = report_files(results_dir)
    if not files:
        raise FileNotFoundError(f"no results files (requests*.parquet) in {results_dir}")
    meta = {k.decode(): v.decode() for k, v in (pq.read_schema(files[0]).metadata or {}).items()
            if not k.startswith(b"ARROW")}
    data = ReportData(files)
    summary = read_summary(results_dir) or summarize_files(files)
    return data, summary, meta


def axis_origin_wall_s(results_dir: str) -> float | None:
    """The Unix time of the report's time axis origin: the earliest run anchor
    (``replayer.t0_wall_s``) among the folder's results files (``load_results`` rebases to it)."""
    walls = []
    for f in report_files(results_dir):
        raw = (pq.read_schema(f).metadata or {}).get(b"replayer.t0_wall_s")
        if raw:
            walls.append(float(raw))
    return min(walls) if walls else None


def figure_specs(data: ReportData, target: pd.DataFrame | None = None,
                 t0_wall_s: float | None = None) -> list[dict]:
    """The data behind every figure of the report, as plain dicts (pure; tested without a
    browser): ``{"title", "x_title", "y_title", "x_type", "y_type", "series": [{"name", "mode",
    "line_shape", "x", "y"}]}`` with ``x``/``y`` NumPy arrays (``*_type``: "linear" or "log";
    ``mode``: "lines" or "markers"). ``data``: the requests folded (``load_results``); ``target``:
    the target's metric samples (``target_metrics.read_samples``) or None; ``t0_wall_s``: the Unix
    time of the requests' time axis origin, so the target's samples share that axis."""
    x, bin_s = data.edges[:-1], data.bin_s
    specs: list[dict] = []

    def spec(title, x_title, y_title, series, x_type="linear", y_type="linear") -> None:
        specs.append({"title": title, "x_title": x_title, "y_title": y_title, "x_type": x_type,
                      "y_type": y_type, "series": series})

    def line(name, x, y, shape="linear") -> dict:
        return {"name": name, "mode": "lines", "line_shape": shape, "x": np.asarray(x), "y": np.asarray(y)}

    def dots(name, x, y) -> dict:
        return {"name": name, "mode": "markers", "line_shape": None, "x": np.asarray(x), "y": np.asarray(y)}

    spec("Arrivals: due vs sent vs completed", "time since start (s)", "requests/s",
         [line(name, x, data.per_bin[key] / bin_s, shape="hv")
          for name, key in (("due (schedule)", "due"), ("sent", "sent"), ("completed", "completed"))])

    d = data.ok_sample.frame()
    spec("Latency over time (successful requests)", "send time (s)", "seconds",
         [dots(name, d["sent_s"] if len(d) else [], d[col] / 1e3 if len(d) else [])
          for col, name in (("ttft_ms", "TTFT"), ("e2e_ms", "E2E"))], y_type="log")

    cdfs = {**data.latency, **(data.from_due if data.has_from_due else {})}
    spec("Latency CDFs", "seconds", "fraction of samples",
         [line(name, *stat.cdf(MAX_POINTS)) for name, stat in cdfs.items()], x_type="log")

    spec("Token throughput", "completion time (s)", "tokens/s",
         [line(name, x, data.per_bin[key] / bin_s, shape="hv")
          for name, key in (("completion tokens/s (server usage)", "completion_tokens"),
                            ("prompt tokens/s (server usage)", "prompt_tokens"))])

    d = data.sent_sample.frame()
    spec("Dispatch lag", "due time (s)", "sent - due (ms)",
         [dots("lag", d["due_s"] if len(d) else [], d["dispatch_lag_ms"] if len(d) else [])])

    if data.failed_by_kind:
        spec("Unsuccessful requests by kind", "due time (s)", f"requests per {bin_s:g} s",
             [line(kind, x, data.failed_by_kind[kind], shape="hv") for kind in sorted(data.failed_by_kind)])

    if target is not None and len(target):
        specs.extend(target_specs(target, t0_wall_s))
    return specs


#: a target metric's unit on the plot: a gauge's as reported, a counter's as a rate per second
def _target_unit(metric: str, kind: str) -> str:
    if kind == "gauge":
        return "fraction (0-1)" if metric.endswith("_perc") else "requests" if "num_requests" in metric else "value"
    if metric.endswith("_seconds_sum"):
        return "seconds/s"
    return "tokens/s" if "tokens" in metric else "per second"


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
    return [{"title": f"Target server metrics: {unit}", "x_title": "time since start (s)", "y_title": unit,
             "x_type": "linear", "y_type": "linear", "series": series} for unit, series in by_unit.items()]


def figures(data: ReportData, target: pd.DataFrame | None = None,
            t0_wall_s: float | None = None) -> list[tuple[str, object]]:
    """The report's plotly figures as (title, figure), drawn from ``figure_specs``."""
    return draw(figure_specs(data, target, t0_wall_s))


def draw(specs: list[dict]) -> list[tuple[str, object]]:
    """Plotly figures as (title, figure) of figure specs (``figure_specs``' shape; ``mode`` may
    also be "lines+markers")."""
    import plotly.graph_objects as go

    out = []
    for sp in specs:
        f = go.Figure()
        for se in sp["series"]:
            kw = {"marker": {"size": 4, "opacity": 0.6}} if se["mode"] == "markers" else {"line_shape": se["line_shape"]}
            f.add_trace(go.Scatter(x=se["x"], y=se["y"], mode=se["mode"], name=se["name"], **kw))
        f.update_layout(xaxis_title=sp["x_title"], yaxis_title=sp["y_title"], xaxis_type=sp["x_type"],
                        yaxis_type=sp["y_type"])
        out.append((sp["title"], f))
    return out


def _number(v: float | int) -> str:
    """One number format for the summary table: thousands separators; a whole float as an int
    (a counter's delta), 3 decimals from 1 up, 4 significant digits below."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int) or (math.isfinite(v) and v == int(v)):
        return f"{int(v):,}"
    return f"{v:,.3f}" if abs(v) >= 1 else f"{v:.4g}"


#: summary entries left out of the report's table (raw per-series state a resumed run carries on)
_TABLE_SKIP = ("series_totals",)


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
            rows.append((name, ", ".join(_number(x) if not isinstance(x, dict) else
                                         " ".join(f"{a}={_number(b)}" for a, b in x.items()) for x in v) or "-"))
        else:
            rows.append((name, _number(v)))
    return rows


def _summary_table(summary: dict) -> str:
    return "<table class='summary'>" + "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in summary_rows(summary)) + "</table>"


def _verdict_section(summary: dict) -> str:
    """The verdict (``replayer.verdict.verdict_rows``) as the report's first section; "" without bounds."""
    from .verdict import verdict_rows

    rows = verdict_rows(summary)
    if not rows:
        return ""
    cells = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return ("<section class='verdict'><h2>Verdict</h2><p>A request meets the SLO when it succeeded and every "
            "bound holds; failed requests count as missed, unknown ones are left out.</p>"
            f"<table class='summary'>{cells}</table></section>")


def _page(title: str, heading: str, intro: str, figs: list[tuple[str, object]], tail: str = "") -> str:
    """One self-contained HTML page (plotly.js inlined once): ``intro`` (HTML), the figures (div
    ids ``fig0``, ``fig1``...), then ``tail`` (HTML)."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    parts = []
    for i, (fig_title, fig) in enumerate(figs):
        fig.update_layout(title=fig_title, height=420, margin={"l": 60, "r": 20, "t": 50, "b": 50},
                          template="plotly_white")
        parts.append(f"<section class='plot'>{pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f'fig{i}')}</section>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<script type="text/javascript">{get_plotlyjs()}</script>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}} table.summary{{border-collapse:collapse;font-size:13px}}
table.summary td,table.summary th{{border-bottom:1px solid #ddd;padding:2px 10px}} section.plot{{margin:1.5em 0}}</style></head>
<body><h1>{html.escape(heading)}</h1>{intro}
{''.join(parts)}
{tail}
</body></html>
"""


def render_html(results_dir: str) -> str:
    """The report of ``results_dir`` as one self-contained HTML string."""
    from .target_metrics import read_samples

    data, summary, meta = load_results(results_dir)
    samples = read_samples(results_dir)
    target = samples.to_pandas() if samples is not None else None
    info = {k: meta.get(f"replayer.{k}") for k in ("version", "trace", "target", "model")}
    head = " · ".join(f"{k}: {html.escape(str(v))}" for k, v in info.items() if v)
    intro = (f"<p>{head}</p><p>{len(data):,} requests; results folder {html.escape(os.path.abspath(results_dir))}</p>\n"
             + _verdict_section(summary))
    return _page(f"replayer report: {os.path.basename(os.path.abspath(results_dir))}", "replayer report", intro,
                 figures(data, target, axis_origin_wall_s(results_dir)),
                 f"<h2>Summary</h2>{_summary_table(summary)}")


def write_report(results_dir: str, output: str | None = None) -> str:
    """Write the report (default ``RESULTS/report.html``); returns its path."""
    output = output or os.path.join(results_dir, "report.html")
    text = render_html(results_dir)
    with open(output, "w", encoding="utf-8") as f:
        f.write(text)
    return output


# --------------------------------------------------------------------------------------------
# sweep


#: (summary key, label) of the latency figures of a sweep page: p50 and p99 of each
_SWEEP_LATENCIES = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("E2E", "e2el_ms"))


def sweep_figure_specs(sweep: dict) -> list[dict]:
    """The data behind the sweep page's figures (pure; ``figure_specs``' shape), each against
    the offered load (requests/s) of the sweep's points (``replayer.sweep``'s ``sweep.json``):
    goodput and throughput, SLO attainment (overall, per bound, and ``--min-attainment``),
    TTFT/TPOT/E2E p50 and p99, dispatch lag p50 and p99 (and the bound past which the replayer
    is behind). Points without an offered load are left out."""
    pts = [p for p in sweep.get("points", []) if p.get("offered_rps")]
    x = np.array([p["offered_rps"] for p in pts], dtype=np.float64)

    def col(key: str) -> np.ndarray:
        return np.array([np.nan if p.get(key) is None else p[key] for p in pts], dtype=np.float64)

    def series(name: str, y, mode: str = "lines+markers", xs=None) -> dict:
        return {"name": name, "mode": mode, "line_shape": "linear", "x": x if xs is None else np.asarray(xs),
                "y": np.asarray(y, dtype=np.float64)}

    def spec(title, y_title, ss, y_type="linear") -> dict:
        return {"title": title, "x_title": "offered load (requests/s)", "y_title": y_title, "x_type": "log",
                "y_type": y_type, "series": ss}

    ends = [x.min(), x.max()] if x.size else []
    bounds = list(sweep.get("goodput_slos_ms") or {})
    return [
        spec("Goodput and throughput vs offered load", "requests/s",
             [series("request goodput (met every bound)", col("request_goodput")),
              series("request throughput (completed)", col("request_throughput")),
              series("offered", x, mode="lines")]),
        spec("SLO attainment vs offered load", "fraction of judged requests",
             [series("every bound", col("slo_attainment")),
              *(series(f"{b} <= {sweep['goodput_slos_ms'][b]:g} ms", col(f"slo_attainment_{b}")) for b in bounds),
              series(f"--min-attainment {sweep.get('min_attainment', 0.9):g}",
                     [sweep.get("min_attainment", 0.9)] * len(ends), mode="lines", xs=ends)]),
        *(spec(f"{label} vs offered load", "ms",
               [series(f"{label} p50", col(f"median_{key}")), series(f"{label} p99", col(f"p99_{key}"))],
               y_type="log") for label, key in _SWEEP_LATENCIES),
        spec("Dispatch lag vs offered load (the replayer's own delay)", "ms",
             [series("dispatch lag p50", col("dispatch_lag_p50_ms")),
              series("dispatch lag p99", col("dispatch_lag_p99_ms")),
              series("replayer behind above", [sweep.get("max_dispatch_lag_p99_ms", 50.0)] * len(ends),
                     mode="lines", xs=ends)]),
    ]


def _points_table(sweep: dict) -> str:
    cols = (("index", "point"), ("speedup", "speed-up"), ("offered_rps", "offered req/s"),
            ("slo_attainment", "attainment"), ("request_goodput", "goodput req/s"), ("p99_ttft_ms", "TTFT p99 ms"),
            ("p99_tpot_ms", "TPOT p99 ms"), ("p99_e2el_ms", "E2E p99 ms"), ("dispatch_lag_p99_ms", "lag p99 ms"),
            ("status", "status"), ("results", "results folder"))
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in cols)

    def cell(p: dict, k: str) -> str:
        v = p.get(k)
        return "n/a" if v is None else f"{v:.1%}" if k == "slo_attainment" else _number(v)

    rows = "".join("<tr>" + "".join(f"<td>{html.escape(cell(p, k))}</td>" for k, _ in cols) + "</tr>"
                   for p in sweep.get("points", []))
    return f"<table class='summary'><tr>{head}</tr>{rows}</table>"


def render_sweep_html(sweep: dict) -> str:
    """The sweep page (``replayer.sweep``'s ``sweep.json``) as one self-contained HTML string:
    the verdict (the highest speed-up that held, why the sweep stopped), the points, the plots."""
    held = sweep.get("highest_held_speedup")
    slos = " ".join(f"{k}&lt;={v:g} ms" for k, v in (sweep.get("goodput_slos_ms") or {}).items())
    verdict = (f"the highest speed-up that held: <b>{held:g}x</b> "
               f"({_number(sweep.get('highest_held_offered_rps') or 0)} "
               f"requests/s offered, goodput {_number(sweep.get('highest_held_request_goodput') or 0)} requests/s)"
               if held is not None else "<b>no speed-up held</b>")
    behind = [p for p in sweep.get("points", []) if p.get("replayer_behind")]
    at = ", ".join(f"{p['speedup']:g}x" for p in behind)
    note = (f"<p>The replayer itself fell behind at {at}: those points "
            "measure the client, not the server.</p>" if behind else "")
    intro = (f"<p>trace: {html.escape(str(sweep.get('trace')))} · target: {html.escape(str(sweep.get('target')))} · "
             f"SLO: {slos} · a point holds when at least {sweep.get('min_attainment', 0.9):.0%} of its judged "
             "requests "
             f"met every bound · prefix cache between points: {html.escape(str(sweep.get('prefix_cache')))}</p>"
             f"<h2>Verdict</h2><p>{verdict}; stopped: {html.escape(str(sweep.get('stop_reason')))}</p>{note}"
             f"<h2>Points</h2>{_points_table(sweep)}")
    return _page("replayer sweep", "replayer sweep", intro, draw(sweep_figure_specs(sweep)))


def write_sweep_report(sweep: dict, output: str) -> str:
    """Write the sweep page to ``output``; returns its path."""
    text = render_sweep_html(sweep)
    with open(output, "w", encoding="utf-8") as f:
        f.write(text)
    return output


# --------------------------------------------------------------------------------------------
# compare


#: (key, label, better) - better: "lower", "higher" or "" (no judgement)
COMPARE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("scheduled", "scheduled", ""), ("sent", "sent", ""), ("completed", "completed", "higher"),
    ("failed", "failed", "lower"), ("duration", "duration (s)", ""),
    ("request_throughput", "request throughput (req/s)", "higher"),
    ("output_throughput", "output throughput (tok/s)", "higher"),
    ("total_token_throughput", "total token throughput (tok/s)", "higher"),
    ("median_ttft_ms", "TTFT median (ms)", "lower"), ("p90_ttft_ms", "TTFT p90 (ms)", "lower"),
    ("p99_ttft_ms", "TTFT p99 (ms)", "lower"),
    ("median_tpot_ms", "TPOT median (ms)", "lower"), ("p99_tpot_ms", "TPOT p99 (ms)", "lower"),
    ("median_itl_ms", "ITL median (ms)", "lower"), ("p99_itl_ms", "ITL p99 (ms)", "lower"),
    ("median_e2el_ms", "E2E median (ms)", "lower"), ("p99_e2el_ms", "E2E p99 (ms)", "lower"),
    ("p99_ttft_from_due_ms", "TTFT from due p99 (ms)", "lower"),
    ("p99_e2el_from_due_ms", "E2E from due p99 (ms)", "lower"),
    ("slo_attainment", "SLO attainment", "higher"), ("request_goodput", "request goodput (req/s)", "higher"),
    ("output_token_goodput", "output token goodput (tok/s)", "higher"),
    ("dispatch_lag_p50_ms", "dispatch lag p50 (ms)", "lower"),
    ("dispatch_lag_p99_ms", "dispatch lag p99 (ms)", "lower"),
    ("dispatch_lag_max_ms", "dispatch lag max (ms)", "lower"),
    ("prompt_token_mismatches", "prompt-token mismatches", "lower"),
    ("completion_token_mismatches", "completion-token mismatches", "lower"),
    ("usage_missing", "usage missing", "lower"),
)


def _load_summary(path: str) -> dict:
    """A run's summary.json (given the file or its results folder; a folder without one, as a
    killed run leaves, is summarized from its results files). Raises ValueError for a file that
    is not one, OSError for a path that does not exist."""
    if os.path.isdir(path):
        folder, path = path, os.path.join(path, "summary.json")
        if not os.path.exists(path):
            files = report_files(folder)
            if not files:
                raise ValueError(f"{folder}: no summary.json and no results files")
            from .summary import summarize_files

            return {**summarize_files(files), **_setup_of(files[0]), "stopped_early": True,
                    "stop_signal": "a kill (no summary.json)"}
    try:
        with open(path, encoding="utf-8") as f:
            s = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"{path}: not a summary.json (not JSON)") from None
    if not isinstance(s, dict) or not {"completed", "duration"} <= set(s):
        raise ValueError(f"{path}: not a replayer summary.json (no completed/duration)")
    return s


def compare(a: dict, b: dict) -> list[dict]:
    """Rows ``{key, label, a, b, diff, pct, better}`` for every compared field present in either;
    ``diff`` = b - a, ``pct`` = 100 * diff / |a| (None when undefined), ``better`` is "a", "b"
    or "" by the field's direction."""
    rows = []
    for key, label, direction in COMPARE_FIELDS:
        if key not in a and key not in b:
            continue
        va, vb = a.get(key), b.get(key)
        diff = pct = None
        better = ""
        if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
            diff = vb - va
            pct = 100.0 * diff / abs(va) if va else None
            if direction and diff:
                better = "b" if (diff < 0) == (direction == "lower") else "a"
        rows.append({"key": key, "label": label, "a": va, "b": vb, "diff": diff, "pct": pct, "better": better})
    for kind in sorted(set(a.get("errors_by_kind") or {}) | set(b.get("errors_by_kind") or {})):
        va, vb = (a.get("errors_by_kind") or {}).get(kind, 0), (b.get("errors_by_kind") or {}).get(kind, 0)
        rows.append({"key": f"errors_by_kind.{kind}", "label": f"errors: {kind}", "a": va, "b": vb,
                     "diff": vb - va, "pct": 100.0 * (vb - va) / va if va else None,
                     "better": "" if va == vb else ("b" if vb < va else "a")})
    return rows


def _setup_of(results_file: str) -> dict:
    """The summary's setup fields (trace, speed-up, passes, shard, target, model) of the run that
    wrote ``results_file``, from its file metadata (``replayer.config``, ``replayer.target``,
    ``replayer.model``): what a killed run, which wrote no summary.json, still tells."""
    meta = pq.read_schema(results_file).metadata or {}
    try:
        cfg = json.loads(meta.get(b"replayer.config", b"{}"))
    except ValueError:
        cfg = {}
    out = {k: cfg[k] for k in ("trace", "speedup", "loop", "shard") if k in cfg}
    if "target" in cfg:
        out["target_embedded"] = cfg["target"] is None
    for key in ("target", "model"):
        if f"replayer.{key}".encode() in meta:
            out[key] = meta[f"replayer.{key}".encode()].decode()
    return out


#: summary fields that make two runs different experiments when they differ
SETUP_FIELDS = (("trace", "trace"), ("scheduled", "requests scheduled"), ("speedup", "speed-up"),
                ("loop", "passes"), ("shard", "shard"), ("target", "target"), ("model", "model"))


def setup_differences(a: dict, b: dict) -> list[str]:
    """What makes runs ``a`` and ``b`` (``summary.json`` dicts) different experiments: one line
    per differing ``SETUP_FIELDS`` entry (a different trace, size, speed-up, ...), so that a
    latency change is not read as the server's."""
    out = []
    for key, label in SETUP_FIELDS:
        va, vb = a.get(key), b.get(key)
        if key == "target" and a.get("target_embedded") and b.get("target_embedded"):
            continue  # both the embedded simulator (on a free port each time)
        if key in a and key in b and va != vb:
            out.append(f"{label}: {va} in A, {vb} in B")
    for name, s in (("A", a), ("B", b)):
        if s.get("stopped_early"):
            out.append(f"{name} was cut short (by {s.get('stop_signal') or 'a stop'}): its numbers cover part of its run")
    return out


def format_compare(rows: list[dict], name_a: str = "A", name_b: str = "B") -> str:
    def fmt(v) -> str:
        if v is None:
            return "n/a"
        if isinstance(v, float):
            return f"{v:,.2f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    head = ("metric", name_a, name_b, "B - A", "change", "better")
    table = [head] + [(r["label"], fmt(r["a"]), fmt(r["b"]),
                       "" if r["diff"] is None else (("+" if r["diff"] > 0 else "") + fmt(r["diff"])),
                       "" if r["pct"] is None else f"{r['pct']:+.1f}%",
                       {"a": name_a, "b": name_b}.get(r["better"], "")) for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    lines = []
    for n, row in enumerate(table):
        lines.append("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main_report(results: str, output: str | None) -> int:
    if not report_files(results):
        print(f"replayer report: error: no results files (requests*.parquet) in {results}", file=sys.stderr)
        return 2
    try:
        path = write_report(results, output)
    except OSError as e:
        print(f"replayer report: error: cannot write the report: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


def main_compare(a: str, b: str, as_json: bool) -> int:
    try:
        sa, sb = _load_summary(a), _load_summary(b)
    except (OSError, ValueError) as e:
        print(f"replayer compare: error: {e}", file=sys.stderr)
        return 2
    rows = compare(sa, sb)
    differ = setup_differences(sa, sb)
    if as_json:
        print(json.dumps({"a": a, "b": b, "setup_differences": differ, "rows": rows}, indent=2))
    else:
        print(f"A = {a}\nB = {b}\n")
        if differ:
            print("the runs are not the same experiment:\n" + "\n".join(f"  {d}" for d in differ) + "\n")
        print(format_compare(rows))
    return 0
