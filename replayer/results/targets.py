"""Several targets (``replayer.send.routing``): per-target metrics, summary sections and the count of
target switches inside sessions. Warm-up rows are left out of the sections.

The target names are the ``--target`` URLs, a closed set fixed before the run, so the ``target``
label is bounded. Metrics (registered only when the run has several targets, so a one-target
run's ``/metrics`` is as before): ``replayer_target_requests_total{target,outcome}``,
``replayer_target_ttft_seconds{target}`` and ``replayer_target_e2e_latency_seconds{target}``
(successful requests, as the run-wide histograms; explicit log-spaced buckets).

The summary's ``targets`` section has, per target: requests by outcome, failed requests by
error kind, token totals, and count/mean/median/p99 (nearest rank, ``stats.Stat``) of TTFT, E2E
and dispatch lag. ``target_switches``: over every session, the turns (in trace order: loop, row)
sent to another target than the turn before them in the same session; 0 when sessions keep their
target, as the routing rule makes them. Rows with no target (not sent) are left out.

Target metrics (``TargetScrapers``): each target's ``/metrics`` is scraped; the samples carry
the target as the label ``replayer_target``; each target's deltas go in its summary section.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prometheus_client import CollectorRegistry

from replayer.core.errors import SUMMARY_COUNTS, Outcome
from replayer.core.result import without_warmup
from replayer.core.stats import latency_fields
from replayer.observe.groupmetrics import GroupMetrics
from replayer.results.summarytext import fmt_ms, format_groups

_STATS = ("ttft_ms", "e2e_ms", "dispatch_lag_ms")
_COLUMNS = (
    "target",
    "outcome",
    "error_kind",
    "session_id",
    "loop",
    "row",
    "prompt_tokens",
    "completion_tokens",
    "warmup",
    *_STATS,
)


class TargetMetrics(GroupMetrics):
    """The per-target series (``replayer.observe.groupmetrics``), children created up front for every target."""

    def __init__(self, registry: CollectorRegistry, targets: list[str]) -> None:
        super().__init__(registry, "target", targets, "target (--target URL)")


def target_switches(table: pa.Table) -> int:
    """Turns sent to another target than their session's turn before them (module docstring)."""
    if "session_id" not in table.column_names or "target" not in table.column_names:
        return 0
    t = table.filter(pc.and_(pc.is_valid(table.column("session_id")), pc.is_valid(table.column("target"))))
    if t.num_rows < 2:
        return 0
    t = t.sort_by([("session_id", "ascending"), ("loop", "ascending"), ("row", "ascending")])
    sess = t.column("session_id").to_numpy(zero_copy_only=False)
    tgt = t.column("target").to_numpy(zero_copy_only=False)
    return int(np.count_nonzero((sess[1:] == sess[:-1]) & (tgt[1:] != tgt[:-1])))


def _counts(col) -> dict[str, int]:
    """How many times each non-null value occurs in a column."""
    return {v["values"]: v["counts"] for v in pc.value_counts(col).to_pylist() if v["values"] is not None}


def target_sections(table: pa.Table) -> dict:
    """Per-target summary sections of a results table (module docstring); {} when no row has a target."""
    if "target" not in table.column_names:
        return {}
    out: dict[str, dict] = {}
    targets = [t for t in pc.unique(table.column("target")).to_pylist() if t is not None]
    for name in sorted(targets):
        t = table.filter(pc.equal(table.column("target"), name))
        outcomes = _counts(t.column("outcome"))
        sec: dict = {"requests": t.num_rows, **{k: outcomes.get(o.value, 0) for o, k in SUMMARY_COUNTS.items()}}
        failed = t.filter(pc.equal(t.column("outcome"), Outcome.FAILED.value))
        sec["errors_by_kind"] = dict(sorted(_counts(failed.column("error_kind")).items()))
        for col, key in (("prompt_tokens", "total_input_tokens"), ("completion_tokens", "total_output_tokens")):
            v = pc.sum(t.column(col)).as_py()
            sec[key] = int(v) if v is not None else None
        ok = t.filter(pc.equal(t.column("outcome"), Outcome.SUCCESS.value))
        for col in _STATS:
            src = t if col == "dispatch_lag_ms" else ok  # latencies of successful requests, as the run's
            sec.update(
                latency_fields(
                    col.removesuffix("_ms"),
                    np.asarray(src.column(col).to_numpy(zero_copy_only=False), dtype=np.float64),
                )
            )
        out[name] = sec
    return out


def read_targets(*results_dirs: str) -> tuple[dict, int]:
    """(``target_sections``, ``target_switches``) of results folders together (shards, workers;
    ``recorder.result_files``, the needed columns only; a file written before the ``target``
    column existed has no target)."""
    from replayer.record.folder import read_file, result_files

    tables = []
    for d in results_dirs:
        for f in result_files(d):
            try:
                names = set(pq.read_schema(f).names)
            except (OSError, pa.ArrowException):
                continue  # (a damaged file: the summary names it)
            if "target" not in names:
                continue
            t = read_file(f, columns=[c for c in _COLUMNS if c in names])
            if t is not None:
                tables.append(t.replace_schema_metadata(None))
    if not tables:
        return {}, 0
    table = pa.concat_tables(tables, promote_options="default")
    return target_sections(without_warmup(table)), target_switches(table)


def format_targets(sections: dict, switches: int) -> str:
    """One line per target for the printed summary."""
    return format_groups(
        f"Targets (switches inside sessions: {switches})",
        sections,
        lambda s: f" / p99 {fmt_ms(s.get('p99_e2e_ms'))} ms",
    )
