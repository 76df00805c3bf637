"""``replayer compare A B``: two runs' summaries side by side, and what differs in their setups.

Reads each run's ``summary.json`` (recomputed from its results files when missing) and the
settings recorded in its results files' metadata; prints a table (or JSON) of the headline
numbers with their differences, and warns when the two runs are not the same experiment.
"""

from __future__ import annotations

import json
import os
import sys

import pyarrow.parquet as pq

from replayer.results.reportdata import report_files
from replayer.results.runread import read_json_file
from replayer.results.summarytext import synthetic_text

COMPARE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("scheduled", "scheduled", ""),
    ("sent", "sent", ""),
    ("completed", "completed", "higher"),
    ("failed", "failed", "lower"),
    ("duration", "duration (s)", ""),
    ("request_throughput", "request throughput (req/s)", "higher"),
    ("output_throughput", "output throughput (tok/s)", "higher"),
    ("total_token_throughput", "total token throughput (tok/s)", "higher"),
    ("median_ttft_ms", "TTFT median (ms)", "lower"),
    ("p90_ttft_ms", "TTFT p90 (ms)", "lower"),
    ("p99_ttft_ms", "TTFT p99 (ms)", "lower"),
    ("median_tpot_ms", "TPOT median (ms)", "lower"),
    ("p99_tpot_ms", "TPOT p99 (ms)", "lower"),
    ("median_itl_ms", "ITL median (ms)", "lower"),
    ("p99_itl_ms", "ITL p99 (ms)", "lower"),
    ("median_e2el_ms", "E2E median (ms)", "lower"),
    ("p99_e2el_ms", "E2E p99 (ms)", "lower"),
    ("p99_ttft_from_due_ms", "TTFT from due p99 (ms)", "lower"),
    ("p99_e2el_from_due_ms", "E2E from due p99 (ms)", "lower"),
    ("slo_attainment", "SLO attainment", "higher"),
    ("request_goodput", "request goodput (req/s)", "higher"),
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
    is not one or a path that does not exist or cannot be read."""
    if os.path.isdir(path):
        folder, path = path, os.path.join(path, "summary.json")
        if not os.path.exists(path):
            files = report_files(folder)
            if not files:
                raise ValueError(f"{folder}: no summary.json and no results files")
            from replayer.results.summary import summarize_files

            return {
                **summarize_files(files),
                **setup_of(files[0]),
                "stopped_early": True,
                "stop_signal": "a kill (no summary.json)",
            }
    try:
        s = read_json_file(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such results folder or summary.json") from None
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
        rows.append(
            {
                "key": f"errors_by_kind.{kind}",
                "label": f"errors: {kind}",
                "a": va,
                "b": vb,
                "diff": vb - va,
                "pct": 100.0 * (vb - va) / va if va else None,
                "better": "" if va == vb else ("b" if vb < va else "a"),
            }
        )
    return rows


def setup_of(results_file: str) -> dict:
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
SETUP_FIELDS = (
    ("trace", "trace"),
    ("synthetic_load", "synthetic load"),
    ("scheduled", "requests scheduled"),
    ("speedup", "speed-up"),
    ("loop", "passes"),
    ("shard", "shard"),
    ("target", "target"),
    ("model", "model"),
)


def setup_differences(a: dict, b: dict) -> list[str]:
    """What makes runs ``a`` and ``b`` (``summary.json`` dicts) different experiments: one line
    per differing ``SETUP_FIELDS`` entry (a different trace, size, speed-up, ...) and for other
    ``--goodput`` bounds (the runs' goodput and SLO attainment then answer other questions), so
    that a change is not read as the server's."""
    out = []
    for key, label in SETUP_FIELDS:
        va, vb = a.get(key), b.get(key)
        if key == "target" and a.get("target_embedded") and b.get("target_embedded"):
            continue  # both the embedded simulator (on a free port each time)
        if key in a and key in b and va != vb:
            if key == "synthetic_load":  # (None: a trace was replayed)
                va, vb = (synthetic_text(v) if isinstance(v, dict) else "none" for v in (va, vb))
            out.append(f"{label}: {va} in A, {vb} in B")
    bounds_a, bounds_b = a.get("goodput_slos_ms") or {}, b.get("goodput_slos_ms") or {}
    if bounds_a != bounds_b:  # (each run's goodput and SLO attainment judged by its own bounds)
        text_a, text_b = (" ".join(f"{k}:{v:g}" for k, v in x.items()) or "none" for x in (bounds_a, bounds_b))
        out.append(f"--goodput bounds (ms): {text_a} in A, {text_b} in B")
    for name, s in (("A", a), ("B", b)):
        if s.get("stopped_early"):
            out.append(
                f"{name} was cut short (by {s.get('stop_signal') or 'a stop'}): its numbers cover part of its run"
            )
    return out


def format_compare(rows: list[dict], name_a: str = "A", name_b: str = "B") -> str:
    def fmt(v) -> str:
        if v is None:
            return "n/a"
        if isinstance(v, float):
            return f"{v:,.2f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    head = ("metric", name_a, name_b, "B - A", "change", "better")
    table = [head] + [
        (
            r["label"],
            fmt(r["a"]),
            fmt(r["b"]),
            "" if r["diff"] is None else (("+" if r["diff"] > 0 else "") + fmt(r["diff"])),
            "" if r["pct"] is None else f"{r['pct']:+.1f}%",
            {"a": name_a, "b": name_b}.get(r["better"], ""),
        )
        for r in rows
    ]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    lines = []
    for n, row in enumerate(table):
        lines.append(
            "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _span_rows(sa: dict, sb: dict, files: list[str]) -> list[dict]:
    """``--spans FILE [FILE_B]``: the two runs' splits (``replayer.results.spanjoin``), each run's
    requests picked by its run id (one file may hold both runs, as a collector writes them)."""
    from replayer.results.spanjoin import compare_rows, read_spans, split_spans

    spans_a = read_spans(files[0])
    spans_b = read_spans(files[1]) if len(files) > 1 else spans_a
    return compare_rows(split_spans(spans_a, sa.get("run_id")), split_spans(spans_b, sb.get("run_id")))


def main_compare(a: str, b: str, as_json: bool, spans: list[str] | None = None) -> int:
    from replayer.results.spanjoin import SpansError

    try:
        sa, sb = _load_summary(a), _load_summary(b)
        rows = compare(sa, sb)
        if spans and len(spans) > 2:
            raise ValueError("--spans takes one file (both runs) or two (A's, then B's)")
        if spans:
            rows += _span_rows(sa, sb, spans)
    except (OSError, ValueError, SpansError) as e:
        print(f"replayer compare: error: {e}", file=sys.stderr)
        return 2
    differ = setup_differences(sa, sb)
    if as_json:
        print(json.dumps({"a": a, "b": b, "setup_differences": differ, "rows": rows}, indent=2))
    else:
        print(f"A = {a}\nB = {b}\n")
        if differ:
            print("the runs are not the same experiment:\n" + "\n".join(f"  {d}" for d in differ) + "\n")
        print(format_compare(rows))
    return 0
