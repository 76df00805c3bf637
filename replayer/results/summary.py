"""Run summary: aggregate per-request results into the numbers a user reads first.

Field names follow `vllm bench serve` (``duration``, ``completed``, ``failed``,
``total_input_tokens``, ``total_output_tokens``, ``request_throughput``, ``output_throughput``,
``total_token_throughput``, ``mean_/median_/p99_`` of ``ttft_ms``, ``tpot_ms``, ``itl_ms``,
``e2el_ms``), plus replayer's own accounting (``scheduled``, ``sent``, ``cancelled``,
``not_started``, dispatch lag, usage audit). Statistics skip unmeasured values (``None``) and an
empty statistic is ``None`` (printed "n/a"), never 0 (cases B05, B13, B25). Token totals come
from the server's usage; ``total_input_tokens`` counts the server-reported prompt tokens of
completed requests. Statistics are folded batch by batch (``SummaryFold``, ``replayer.core.stats``), so
a results folder of any size is summarized in bounded memory, and folds of files, shards and
runs merge (never their percentiles).
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

import replayer.results.verdict as verdict
from replayer.record.runwindows import removed_of as _removed_of, run_durations, run_windows
from replayer.results.concurrency import PeakFold, peak_of_files
from replayer.results.fold import SummaryFold, set_duration
from replayer.results.foldcolumns import BATCH_ROWS, COLUMNS, PERCENTILES
from replayer.results.foldjson import fold_from_json
from replayer.results.summarytext import format_summary


def summarize(table: pa.Table, slos: dict[str, float] | None = None) -> dict:
    """Summary dict of a results table (schema ``result.SCHEMA``). JSON-ready (None for n/a).

    Generation statistics (TTFT, TPOT, ITL, token audits) cover generation endpoints only;
    pooling requests (embeddings, score, rerank) have E2E latency and their own usage audit
    (``usage_audit``: ok / inflated / missing per endpoint; ``replayer.http.audit``). ``sessions``:
    session count, turns, turns held back for their predecessor and the wait (ms) it cost.
    Percentiles: ``stats.PERCENTILE_METHOD`` (said in ``percentile_method``; the statistics
    whose percentiles came from the sketch are listed in ``percentiles_sketched``). ``slos``
    (``--goodput`` bounds, ms): adds the verdict (``replayer.results.verdict.finish``'s fields)."""
    fold = SummaryFold(slos)
    fold.add(table)
    s = fold.result()
    peaks = PeakFold()
    if {"sent_ns", "end_ns"} <= set(table.schema.names):
        peaks.add(table)
    s.update(peaks.peak().fields())  # the most requests in flight at once
    return s


def fold_file(path: str, slos: dict[str, float] | None = None) -> SummaryFold | None:
    """A results file folded batch by batch (``BATCH_ROWS`` rows, only the ``COLUMNS`` it has),
    or None when it is damaged (reported by name; none of its rows count)."""
    from replayer.record.folder import open_file, report_damaged

    pf = open_file(path)
    if pf is None:
        return None
    fold = SummaryFold(slos)
    names = set(pf.schema_arrow.names)  # (the schema is built anew on each access)
    columns = [c for c in COLUMNS if c in names]
    try:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=columns):
            fold.add(batch)
    except (OSError, pa.ArrowException) as e:
        report_damaged(path, e)
        return None
    return fold


def fold_files(files: list[str], slos: dict[str, float] | None = None) -> tuple[SummaryFold, list[str]]:
    """(every readable file of ``files`` folded into one, the damaged files). ``slos``: the
    ``--goodput`` bounds (ms) to judge requests by (None: those the run that wrote the first
    readable file was given, from its metadata: ``goodput_of``). The results retention removed
    from the folders of ``files`` are merged from their digest (``retention``: counts exact,
    percentiles from the sketch)."""
    from replayer.record.folder import open_file

    if slos is None:
        slos = next((goodput_of(pf) for f in files if (pf := open_file(f)) is not None), {})
    total, damaged = SummaryFold(slos), []
    for f in files:
        fold = fold_file(f, slos)
        if fold is None:
            damaged.append(f)
        else:
            total.merge(fold)
    for removed in _removed_of(files):  # results files retention removed: their digest
        if removed.fold_json:
            total.merge(fold_from_json(removed.fold_json))
    return total, damaged


def summarize_files(files: list[str], *, slos: dict[str, float] | None = None, held: pa.Table | None = None) -> dict:
    """``summarize`` of results files, read in bounded memory (a days-long soak writes many
    millions of rows): batch by batch, only the columns the summary needs, folded into one
    ``SummaryFold`` (counts exact, statistics from ``stats.Stat``: exact count, sum, min, max
    and variance at any size; percentiles exact up to ``stats.EXACT_LIMIT`` values, else within
    the sketch's stated relative error). ``duration`` (and the throughputs) add up the runs
    that wrote the files (``run_durations``): each resumed run has a time axis of its own.
    A damaged file (cut short, not Parquet) is reported by name, left out, and listed in
    ``damaged_files``; the others are summarized. ``slos``: the ``--goodput`` bounds (ms) to judge
    requests by (None: those the run that wrote the first file was given, from its metadata).
    ``held``: results the run could not write (a full disk), counted as if on disk and
    counted in ``results_not_written``. ``max_concurrent_requests``: the most requests in flight
    at once, exact, and when (``replayer.results.concurrency``; files retention removed are not
    in it)."""
    fold, damaged = fold_files(files, slos)
    held = held if held is not None and held.num_rows else None
    if held is not None:
        one = SummaryFold(fold.slos)
        one.add(held.select([c for c in COLUMNS if c in held.schema.names]))
        fold.merge(one)
    s = fold.result()
    if damaged:
        s["damaged_files"] = damaged
    if held is not None:
        s["results_not_written"] = held.num_rows
    peak = peak_of_files([f for f in files if f not in damaged], held)
    s.update(peak.fields())  # the most requests in flight at once (exact)
    runs = run_durations([f for f in files if f not in damaged], [held] if held is not None else [])
    set_duration(s, sum(runs))
    if len(runs) > 1:
        s["runs"] = len(runs)
    return s


def goodput_of(pf: pq.ParquetFile) -> dict[str, float]:
    """The ``--goodput`` bounds (ms) of the run that wrote a results file ({} if none), from its
    metadata (``replayer.config``)."""
    try:
        cfg = json.loads((pf.schema_arrow.metadata or {}).get(b"replayer.config", b"{}"))
        return verdict.parse_goodput(cfg.get("goodput")) if isinstance(cfg, dict) else {}
    except ValueError:
        return {}


def read_summary(results_dir: str) -> dict:
    """A results folder's own ``summary.json`` as a dict ({} if it has none or it is not one)."""
    try:
        with open(os.path.join(results_dir, "summary.json"), encoding="utf-8") as f:
            s = json.load(f)
    except (OSError, ValueError):
        return {}
    return s if isinstance(s, dict) else {}


__all__ = [
    "BATCH_ROWS",
    "COLUMNS",
    "PERCENTILES",
    "SummaryFold",
    "fold_file",
    "fold_files",
    "format_summary",
    "goodput_of",
    "read_summary",
    "run_durations",
    "run_windows",
    "set_duration",
    "summarize",
    "summarize_files",
]
