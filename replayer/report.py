"""Offline HTML report of one run's results folder (never imported by the daemon).

``replayer report RESULTS [-o report.html]`` reads every results file of ``RESULTS`` (rolled
files and parts, a resumed run's, or a ``--workers`` run's worker folders; schema in
``replayer/result.py``), ``RESULTS/summary.json`` (recomputed if missing) and, when present,
the target's metric samples (``RESULTS/target_metrics.parquet`` and parts a run still going or
killed left: ``replayer.target_metrics.read_samples``), and writes one self-contained HTML file (plotly.js inlined
once; no network needed to view it) with: arrivals due vs sent vs completed over time, latency
over time, latency CDFs, token throughput, dispatch lag, errors, and the target's metrics.

``target_metrics.parquet`` may be long (columns ``name``, ``value`` and a time column) or wide
(a time column plus one numeric column per series); the time column is the first of
``t_s``, ``time_s``, ``timestamp``, ``time``, ``t_ns``, ``time_ns`` found.
"""

from __future__ import annotations

import glob
import html
import json
import os
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

#: keep plots light (SVG): at most this many points per trace (uniform subsample)
MAX_POINTS = 5_000
TIME_COLUMNS = ("t_s", "time_s", "timestamp", "time", "t_ns", "time_ns")


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


def load_results(results_dir: str) -> tuple[pd.DataFrame, dict, dict]:
    """(requests frame, summary dict, parquet metadata dict of the first file) of a results
    folder: every results file (``report_files``), times rebased to the earliest run anchor
    (a resumed run or a worker has an anchor of its own; ``replayer.workers``)."""
    from .summary import read_summary
    from .workers import read_on_one_axis

    files = report_files(results_dir)
    if not files:
        raise FileNotFoundError(f"no results files (requests*.parquet) in {results_dir}")
    meta = {k.decode(): v.decode() for k, v in (pq.read_schema(files[0]).metadata or {}).items()
            if not k.startswith(b"ARROW")}
    table = read_on_one_axis(files)
    summary = read_summary(results_dir)
    if not summary:
        from .summary import summarize

        summary = summarize(table)
    return table.to_pandas(), summary, meta


def _sub(df: pd.DataFrame, n: int = MAX_POINTS) -> pd.DataFrame:
    return df if len(df) <= n else df.sample(n=n, random_state=0).sort_index()


def _per_second(seconds: pd.Series, bin_s: float, end_s: float, weights: pd.Series | None = None) -> tuple:
    edges = np.arange(0.0, max(end_s, bin_s) + bin_s, bin_s)
    counts, _ = np.histogram(seconds.dropna(), bins=edges,
                             weights=None if weights is None else weights.loc[seconds.dropna().index])
    return edges[:-1], counts / bin_s


def _cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(values[~np.isnan(values)])
    if v.size > MAX_POINTS:
        idx = np.linspace(0, v.size - 1, MAX_POINTS).astype(int)
        return v[idx], (idx + 1) / v.size
    return v, np.arange(1, v.size + 1) / max(v.size, 1)


def figures(df: pd.DataFrame, target: pd.DataFrame | None = None) -> list[tuple[str, object]]:
    """The report's plotly figures as (title, figure)."""
    import plotly.graph_objects as go

    s = lambda col: df[col].astype("float64") / 1e9  # noqa: E731 - ns since anchor -> s
    due, sent, end = s("due_ns"), s("sent_ns"), s("end_ns")
    ok = df["outcome"] == "success"
    span = float(np.nanmax([due.max(), end.max() if end.notna().any() else 0.0, 1.0]))
    bin_s = max(1.0, span / 300)
    figs: list[tuple[str, object]] = []

    f = go.Figure()
    for name, col in (("due (schedule)", due), ("sent", sent), ("completed", end.where(ok))):
        x, y = _per_second(col, bin_s, span)
        f.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, line_shape="hv"))
    f.update_layout(xaxis_title="time since start (s)", yaxis_title="requests/s")
    figs.append(("Arrivals: due vs sent vs completed", f))

    f = go.Figure()
    d = _sub(df[ok])
    for col, name in (("ttft_ms", "TTFT"), ("e2e_ms", "E2E")):
        f.add_trace(go.Scatter(x=d["sent_ns"] / 1e9, y=d[col] / 1e3, mode="markers", name=name,
                                 marker={"size": 4, "opacity": 0.6}))
    f.update_layout(xaxis_title="send time (s)", yaxis_title="seconds", yaxis_type="log")
    figs.append(("Latency over time (successful requests)", f))

    f = go.Figure()
    itl = np.concatenate([np.asarray(v, dtype=np.float64) for v in df.loc[ok, "itl_ms"] if v is not None and len(v)]
                         or [np.zeros(0)])
    for name, values in (("TTFT", df.loc[ok, "ttft_ms"].to_numpy(np.float64)),
                         ("E2E", df.loc[ok, "e2e_ms"].to_numpy(np.float64)),
                         ("TPOT", df.loc[ok, "tpot_ms"].to_numpy(np.float64)),
                         ("ITL (token-weighted)", itl)):
        x, y = _cdf(values / 1e3)
        f.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name))
    f.update_layout(xaxis_title="seconds", yaxis_title="fraction of samples", xaxis_type="log")
    figs.append(("Latency CDFs", f))

    f = go.Figure()
    for name, col in (("completion tokens/s (server usage)", "completion_tokens"),
                      ("prompt tokens/s (server usage)", "prompt_tokens")):
        w = df[col].astype("float64").fillna(0.0)
        x, y = _per_second(end.where(ok), bin_s, span, weights=w)
        f.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, line_shape="hv"))
    f.update_layout(xaxis_title="completion time (s)", yaxis_title="tokens/s")
    figs.append(("Token throughput", f))

    f = go.Figure()
    d = _sub(df[df["sent_ns"].notna()])
    f.add_trace(go.Scatter(x=d["due_ns"] / 1e9, y=d["dispatch_lag_ms"], mode="markers", name="lag",
                             marker={"size": 4, "opacity": 0.6}))
    f.update_layout(xaxis_title="due time (s)", yaxis_title="sent - due (ms)")
    figs.append(("Dispatch lag", f))

    failed = df[df["outcome"] != "success"]
    if len(failed):
        f = go.Figure()
        for kind, g in failed.groupby("error_kind"):
            x, y = _per_second(s("due_ns").loc[g.index], bin_s, span)
            f.add_trace(go.Scatter(x=x, y=y * bin_s, mode="lines", name=str(kind), line_shape="hv"))
        f.update_layout(xaxis_title="due time (s)", yaxis_title=f"requests per {bin_s:g} s")
        figs.append(("Unsuccessful requests by kind", f))

    if target is not None and len(target):
        figs.extend(_target_figures(target))
    return figs


def _target_figures(t: pd.DataFrame) -> list[tuple[str, object]]:
    import plotly.graph_objects as go

    tcol = next((c for c in TIME_COLUMNS if c in t.columns), None)
    if tcol is None:
        return []
    x = t[tcol].astype("float64")
    if tcol.endswith("_ns"):
        x = x / 1e9
    x = x - x.min()
    f = go.Figure()
    if {"name", "value"} <= set(t.columns):
        for name, g in t.assign(_x=x).groupby("name"):
            f.add_trace(go.Scatter(x=g["_x"], y=g["value"], mode="lines", name=str(name)))
    else:
        for col in t.columns:
            if col != tcol and pd.api.types.is_numeric_dtype(t[col]):
                f.add_trace(go.Scatter(x=x, y=t[col], mode="lines", name=col))
    f.update_layout(xaxis_title="time (s)", yaxis_title="value")
    return [("Target server metrics", f)]


def _summary_table(summary: dict) -> str:
    rows = []
    for k, v in summary.items():
        if isinstance(v, dict):
            v = ", ".join(f"{a}: {b}" for a, b in v.items()) or "-"
        elif isinstance(v, float):
            v = f"{v:,.3f}"
        elif v is None:
            v = "n/a"
        rows.append(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>")
    return "<table class='summary'>" + "".join(rows) + "</table>"


def render_html(results_dir: str) -> str:
    """The report of ``results_dir`` as one self-contained HTML string."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    from .target_metrics import read_samples

    df, summary, meta = load_results(results_dir)
    samples = read_samples(results_dir)
    target = samples.to_pandas() if samples is not None else None
    parts = []
    for i, (title, fig) in enumerate(figures(df, target)):
        fig.update_layout(title=title, height=420, margin={"l": 60, "r": 20, "t": 50, "b": 50},
                          template="plotly_white")
        parts.append(f"<section class='plot'>{pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f'fig{i}')}</section>")
    info = {k: meta.get(f"replayer.{k}") for k in ("version", "trace", "target", "model")}
    head = " · ".join(f"{k}: {html.escape(str(v))}" for k, v in info.items() if v)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>replayer report: {html.escape(os.path.basename(os.path.abspath(results_dir)))}</title>
<script type="text/javascript">{get_plotlyjs()}</script>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}} table.summary{{border-collapse:collapse;font-size:13px}}
table.summary td{{border-bottom:1px solid #ddd;padding:2px 10px}} section.plot{{margin:1.5em 0}}</style></head>
<body><h1>replayer report</h1><p>{head}</p><p>{len(df):,} requests; results folder {html.escape(os.path.abspath(results_dir))}</p>
{''.join(parts)}
<h2>Summary</h2>{_summary_table(summary)}
</body></html>
"""


def write_report(results_dir: str, output: str | None = None) -> str:
    """Write the report (default ``RESULTS/report.html``); returns its path."""
    output = output or os.path.join(results_dir, "report.html")
    text = render_html(results_dir)
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
