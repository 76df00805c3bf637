"""``replayer history DIR...``: runs over time, for nightly runs and soaks. Each run (or each loop
of a run that made several passes over its trace) is one row: when it started, what it replayed,
its headline numbers (TTFT, TPOT, E2E p50 and p99, error rate) and its verdicts (SLO attainment,
and the ``fidelity`` and ``drift`` verdicts of summaries that have them). Printed as a table, as
JSON, and drawn over time as a self-contained HTML page (the report's plotly).

A run's numbers come from its ``summary.json`` (from its results files when it has none, as a
killed run leaves; a damaged one is an error naming it, as in ``replayer compare``); a loop's from its requests (``replayer.results.read_results``), the
percentiles by nearest rank as the summary's.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
import os
import sys

import numpy as np
import pyarrow.parquet as pq

#: the columns of a history row that are numbers (ms, or a share 0-1), in table order, with their
#: headers: a latency's unit in its header, a share's percent sign in each cell
NUMBERS = (
    ("median_ttft_ms", "TTFT p50 (ms)"),
    ("p99_ttft_ms", "TTFT p99 (ms)"),
    ("median_tpot_ms", "TPOT p50 (ms)"),
    ("p99_tpot_ms", "TPOT p99 (ms)"),
    ("median_e2el_ms", "E2E p50 (ms)"),
    ("p99_e2el_ms", "E2E p99 (ms)"),
    ("error_rate", "errors"),
    ("slo_attainment", "SLO met"),
)
_LOOP_COLUMNS = ["loop", "outcome", "due_ns", "ttft_ms", "tpot_ms", "e2e_ms", "slo_met", "warmup"]


def run_folders(paths: list[str]) -> list[str]:
    """The results folders named: each path a results folder, or a folder whose subfolders are
    (one level). Raises ValueError for a path that is neither."""
    from replayer.record.folder import result_files

    out: list[str] = []
    for p in paths:
        if not os.path.isdir(p):
            raise ValueError(f"{p}: no such folder")
        if result_files(p):
            out.append(p)
            continue
        subs = sorted(os.path.join(p, d) for d in os.listdir(p) if os.path.isdir(os.path.join(p, d)))
        runs = [s for s in subs if result_files(s)]
        if not runs:
            raise ValueError(f"{p}: neither a results folder nor a folder of them (no requests*.parquet)")
        out.extend(runs)
    return out


def _start_wall_s(files: list[str]) -> float | None:
    """The run's anchor (Unix time) from its results files' metadata."""
    for f in files:
        try:
            meta = pq.read_schema(f).metadata or {}
        except (OSError, ValueError):
            continue
        if b"replayer.t0_wall_s" in meta:
            return float(meta[b"replayer.t0_wall_s"])
    return None


def _verdict_of(section: object) -> str | None:
    return section.get("verdict") if isinstance(section, dict) and isinstance(section.get("verdict"), str) else None


def run_row(folder: str) -> tuple[dict, float | None]:
    """A run's history row (and its anchor's Unix time, for its loops)."""
    from replayer.record.folder import result_files
    from replayer.results.runread import summary_of
    from replayer.results.summary import summarize_files

    files = result_files(folder)
    s = summary_of(folder)  # (a damaged one is an error naming it, as in replayer compare)
    if s is None:
        s = summarize_files(files)
    t0 = _start_wall_s(files)
    judged = (s.get("completed") or 0) + (s.get("failed") or 0)
    row = {
        "run": os.path.basename(os.path.normpath(folder)),
        "folder": folder,
        "loop": None,
        "start": t0,
        "trace": os.path.basename(str(s.get("trace") or "")) or ("synthetic" if s.get("synthetic_load") else None),
        "speedup": s.get("speedup"),
        "requests": s.get("completed"),
        **{k: s.get(k) for k, _ in NUMBERS if k != "error_rate"},
        "error_rate": (s.get("failed") or 0) / judged if judged else None,
        "fidelity": _verdict_of(s.get("fidelity")),
        "drift": _verdict_of(s.get("drift")),
        "stopped_early": bool(s.get("stopped_early")),
    }
    return row, t0


def _nearest_rank(v: np.ndarray, p: float) -> float | None:
    v = v[~np.isnan(v)]
    return float(np.percentile(v, p, method="inverted_cdf")) if len(v) else None


def loop_rows(folder: str, run: dict, t0: float | None) -> list[dict]:
    """One row per loop of a run that made several passes (``[]`` for one pass)."""
    from replayer.results import read_results

    t = read_results(folder, columns=list(_LOOP_COLUMNS))
    df = t.to_pandas()
    if "warmup" in df:
        df = df[~df["warmup"].fillna(False).astype(bool)]
    if df["loop"].nunique() < 2:
        return []
    out = []
    for loop, g in df.groupby("loop", sort=True):
        ok = (g["outcome"] == "success").to_numpy()
        judged = int(ok.sum() + (g["outcome"] == "failed").sum())
        met = g["slo_met"].dropna().to_numpy(dtype=bool) if "slo_met" in g else np.zeros(0, bool)
        col = {c: g[c].to_numpy(dtype=np.float64, na_value=np.nan)[ok] for c in ("ttft_ms", "tpot_ms", "e2e_ms")}
        out.append(
            {
                **run,
                "loop": int(loop),
                "start": None if t0 is None else t0 + float(g["due_ns"].min()) / 1e9,
                "requests": int(ok.sum()),
                "median_ttft_ms": _nearest_rank(col["ttft_ms"], 50),
                "p99_ttft_ms": _nearest_rank(col["ttft_ms"], 99),
                "median_tpot_ms": _nearest_rank(col["tpot_ms"], 50),
                "p99_tpot_ms": _nearest_rank(col["tpot_ms"], 99),
                "median_e2el_ms": _nearest_rank(col["e2e_ms"], 50),
                "p99_e2el_ms": _nearest_rank(col["e2e_ms"], 99),
                "error_rate": (judged - int(ok.sum())) / judged if judged else None,
                "slo_attainment": float(np.mean(met)) if len(met) else None,
            }
        )
    return out


def history(paths: list[str], by_run: bool = False) -> list[dict]:
    """The history rows of the folders named, oldest first (a run of several loops as one row
    per loop unless ``by_run``). Raises ValueError for a path that is not a results folder."""
    rows: list[dict] = []
    for folder in run_folders(paths):
        run, t0 = run_row(folder)
        loops = [] if by_run else loop_rows(folder, run, t0)
        rows.extend(loops or [run])
    return sorted(rows, key=lambda r: (r["start"] is None, r["start"] or 0.0, r["run"], r["loop"] or 0))


def _when(t: float | None) -> str:
    return "n/a" if t is None else dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _cell(key: str, v: object) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if key in ("error_rate", "slo_attainment"):
        return f"{100 * float(v):.1f}%"  # type: ignore[arg-type]
    return f"{v:,.1f}" if isinstance(v, float) else str(v)


def verdicts_text(r: dict) -> str:
    parts = [f"{k} {r[k]}" for k in ("fidelity", "drift") if r.get(k)]
    if r.get("stopped_early"):
        parts.append("stopped early")
    return ", ".join(parts) or "-"


#: the history table's columns
HEAD = ("start (UTC)", "run", "loop", "trace", "requests", *(label for _, label in NUMBERS), "verdicts")


def _cells(r: dict) -> tuple[str, ...]:
    """One row of the history table as text, a cell per column of ``HEAD``."""
    return (
        _when(r["start"]),
        r["run"],
        "-" if r["loop"] is None else str(r["loop"]),
        r["trace"] or "n/a",
        _cell("requests", r["requests"]),
        *(_cell(k, r.get(k)) for k, _ in NUMBERS),
        verdicts_text(r),
    )


def format_history(rows: list[dict]) -> str:
    head = HEAD
    table = [head] + [_cells(r) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = [
        "  ".join(
            c.ljust(w) if i < 4 or i == len(head) - 1 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
        )
        for row in table
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def history_specs(rows: list[dict]) -> list[dict]:
    """The history's figures as the report's figure specs (``replayer.results.report.draw``):
    latency percentiles, and error rate with SLO attainment, on a time axis of the runs' (or
    loops') starts."""
    rows = [r for r in rows if r["start"] is not None]  # (a run whose files lost their anchor: in the table only)
    x = np.array([dt.datetime.fromtimestamp(r["start"], dt.timezone.utc).isoformat() for r in rows], dtype=object)

    def series(key: str, label: str, scale: float = 1.0) -> dict:
        y = np.array([np.nan if r.get(key) is None else scale * float(r[key]) for r in rows])
        return {"name": label, "mode": "lines+markers", "line_shape": "linear", "x": x, "y": y}

    x_title = "run start (UTC)"
    return [
        {
            "title": "Latency per run",
            "x_title": x_title,
            "y_title": "ms",
            "x_type": "date",
            "y_type": "log",
            "series": [series(k, label) for k, label in NUMBERS[:6]],
        },
        {
            "title": "Errors and SLO attainment per run",
            "x_title": x_title,
            "y_title": "%",
            "x_type": "date",
            "y_type": "linear",
            "series": [series("error_rate", "error rate", 100.0), series("slo_attainment", "SLO attainment", 100.0)],
        },
    ]


def render_html(rows: list[dict]) -> str:
    """The history as one self-contained HTML page: the figures, then the table."""
    from replayer.results.report import _page, draw

    head = HEAD
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r)) + "</tr>" for r in rows)
    table = "<table class='summary'><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + f"</tr>{body}</table>"
    intro = f"<p>{len(rows)} rows (runs, or a run's loops), oldest first.</p>"
    return _page("replayer history", "replayer history", intro, draw(history_specs(rows)), table)


def main_history(paths: list[str], html_file: str | None, as_json: bool, by_run: bool) -> int:
    """``replayer history``: 0; 2 for a path that is not a results folder or a damaged
    ``summary.json`` (named); ``EXIT_WRITE_FAILED`` (5) when the HTML page cannot be written (the
    table is printed all the same)."""
    from replayer.results.outfile import EXIT_WRITE_FAILED, OutputError, write_text

    try:
        rows = history(paths, by_run)
    except (OSError, ValueError) as e:
        print(f"replayer history: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=2) if as_json else format_history(rows))
    if not html_file:
        return 0
    try:
        write_text(html_file, render_html(rows), "HTML page")
    except OutputError as e:
        print(f"replayer history: error: {e}", file=sys.stderr)
        return EXIT_WRITE_FAILED
    if not as_json:
        print(f"\nhistory drawn: {html_file}")
    return 0
