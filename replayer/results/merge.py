"""Merging results folders (``replayer merge``) onto one time axis: shards run by ``--workers``, on
other machines or pods, and the report's reader of several files.

``merge_results`` puts the results of several folders (workers, or shards run on other machines
or pods) on one time axis: every results file carries its run's wall-clock anchor
(``replayer.t0_wall_s``), and the ``*_ns`` columns of each file are shifted to the earliest
anchor, so the merged duration and throughputs are right even if a shard started late.
``iter_on_one_axis`` reads files batch by batch on that axis (``replayer report`` uses it).
``main_merge`` is ``replayer merge`` (with ``--wait``: ``wait_finished``).
This module starts no process: the supervisor of ``--workers`` is ``replayer.run.workers``.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import replayer.record.lock as folder_lock
from replayer.record.folder import open_file, report_damaged, result_files
from replayer.record.recorder import write_json
from replayer.results.concurrency import PeakFold
from replayer.results.mergecheck import merge_warnings, wait_finished
from replayer.results.summary import BATCH_ROWS, fold_files, format_summary, read_summary, run_windows, set_duration

log = logging.getLogger(__name__)

#: result columns holding ns offsets from the run's anchor (rebased when merging)
TIME_COLUMNS = ("due_ns", "sent_ns", "first_token_ns", "last_token_ns", "end_ns")
#: summary fields the merged summary keeps when every folder has the same value
MERGED_SETUP = ("trace", "synthetic_load", "target", "target_embedded", "model", "speedup", "loop")


def _files(path: str) -> list[str]:
    """The results files of a results folder, or ``[path]`` for one file."""
    return [path] if os.path.isfile(path) else result_files(path)


def _read_dir(path: str) -> list[tuple[str, float | None, str | None]]:
    """(file, anchor wall time in Unix s or None, shard "i/N" or None) for every results file of
    a results folder (or one file) that can be opened (a damaged one is reported by name and
    left out), from the files' metadata alone. Raises FileNotFoundError if there is none."""
    files = _files(path)
    if not files:
        raise FileNotFoundError(f"{path}: no results files")
    out = []
    for f in files:
        pf = open_file(f)
        if pf is None:  # damaged: reported by name, the folder's other files still count
            continue
        meta = pf.schema_arrow.metadata or {}
        wall = meta.get(b"replayer.t0_wall_s")
        shard = None
        if b"replayer.config" in meta:
            try:
                shard = json.loads(meta[b"replayer.config"]).get("shard")
            except (ValueError, AttributeError):
                shard = None
        out.append((f, float(wall) if wall else None, shard))
    if not out:
        raise FileNotFoundError(f"{path}: no readable results files (all {len(files)} damaged)")
    return out


def iter_on_one_axis(files: list[str], columns: list[str], batch_rows: int = BATCH_ROWS):
    """Record batches of ``columns`` of every readable results file of ``files`` (folders or
    files), times rebased to the earliest run anchor among them (a resumed run and each worker
    have an anchor of their own): one batch of ``batch_rows`` rows in memory at a time. A file
    damaged part-way is reported by name and its remaining rows are left out."""
    parts = [p for f in files for p in _read_dir(f)]
    walls = [w for _, w, _ in parts if w is not None]
    base = min(walls) if walls else None
    for f, wall, _ in parts:
        shift = _shift_ns(wall, base)
        pf = open_file(f)
        if pf is None:
            continue
        try:
            for batch in pf.iter_batches(
                batch_size=batch_rows, columns=[c for c in columns if c in pf.schema_arrow.names]
            ):
                yield _rebase(batch, shift)
        except (OSError, pa.ArrowException) as e:
            report_damaged(f, e)


def _shift_ns(wall: float | None, base: float | None) -> int:
    """ns to add to a run's times (offsets from its anchor ``wall``) to put them on the axis of
    the earliest anchor ``base`` (0 when either is unknown)."""
    return round((wall - base) * 1e9) if wall is not None and base is not None else 0


def _union_s(windows: list[tuple[int, int]]) -> float:
    """Seconds covered by the union of [start, end] ns intervals."""
    total, cur = 0, None
    for a, b in sorted(windows):
        if cur is None or a > cur[1]:
            if cur is not None:
                total += cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    if cur is not None:
        total += cur[1] - cur[0]
    return total / 1e9


def _rebase(batch: pa.RecordBatch, shift_ns: int) -> pa.RecordBatch:
    """``batch`` with ``shift_ns`` added to each of its time columns (nulls stay null)."""
    if not shift_ns:
        return batch
    arrays = [
        pc.add(col, pa.scalar(shift_ns, pa.int64())) if name in TIME_COLUMNS else col
        for name, col in zip(batch.schema.names, batch.columns)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema)


def _sent_rows(files: list[str]) -> np.ndarray:
    """The distinct (loop, row) pairs, as ``loop << 40 | row``, that ``files`` recorded as sent
    (8 bytes per row: the one per-row array a merge holds), read three columns at a time."""
    keys = []
    for f in files:
        pf = open_file(f)
        if pf is None:
            continue
        try:
            for b in pf.iter_batches(batch_size=65_536, columns=["loop", "row", "outcome"]):
                sent = pc.fill_null(pc.not_equal(b.column("outcome"), "not_started"), True).to_numpy(
                    zero_copy_only=False
                )
                k = (b.column("loop").to_numpy(zero_copy_only=False).astype(np.int64) << 40) + b.column("row").to_numpy(
                    zero_copy_only=False
                ).astype(np.int64)
                keys.append(np.unique(k[sent]))
        except (OSError, pa.ArrowException) as e:  # damaged part-way: reported, and so in the warnings
            report_damaged(f, e)
    return np.unique(np.concatenate(keys)) if keys else np.zeros(0, dtype=np.int64)


def merge_results(
    dirs: list[str], out_dir: str | None = None, *, quiet: bool = False, one_target: bool = False
) -> dict:
    """``_merge_results`` holding ``out_dir``'s writer lock (``record.lock``; re-entrant: the
    ``--workers`` parent holds its folder's). Raises ``FolderBusy`` when a run is writing there."""
    if not out_dir:
        return _merge_results(dirs, None, quiet=quiet, one_target=one_target)
    os.makedirs(out_dir, exist_ok=True)
    with folder_lock.hold(out_dir, "merge"):
        return _merge_results(dirs, out_dir, quiet=quiet, one_target=one_target)


def _merge_results(
    dirs: list[str], out_dir: str | None = None, *, quiet: bool = False, one_target: bool = False
) -> dict:
    """One summary over several results folders (shards or workers). Writes
    ``out_dir/summary.json`` when ``out_dir`` is given. Raises FileNotFoundError for a folder
    with no results.

    Times of every file are rebased to the earliest run anchor among them (see the module
    docstring). Besides the ``summary.summarize`` fields the summary holds ``merged_from``,
    ``shards`` (the ``--shard`` of each folder), ``anchor_spread_s`` (latest - earliest anchor of
    the folders' first runs: a later run in a folder is a resume), ``duration`` (the time some run
    was replaying, on the shared axis: the union of each run's first-send..last-end),
    ``duplicate_rows`` ((loop, row) pairs sent by more than one folder: overlapping shards or a
    folder given twice), ``merge_warnings``, ``events`` (every folder's, ``merged_events``), and ``stopped_early``/``stop_signal`` when a folder's
    own summary says a stop cut its run short, ``run_id`` (the folders' run id: a list when they
    differ, as in a merge of separate runs). ``one_target`` (``--workers``: every folder
    scraped the same server) keeps the target-metric view of the folder with the most scrapes."""
    per_dir = [_read_dir(d) for d in dirs]
    walls = [w for files in per_dir for _, w, _ in files if w is not None]
    base = min(walls) if walls else None
    # each folder's first run: a later anchor in a folder is a resumed run, not a late shard
    starts = [min(ws) for ws in ([w for _, w, _ in files if w is not None] for files in per_dir) if ws]
    windows, shards_by_dir, duplicates = _layout(dirs, per_dir, base)
    own = [read_summary(d) for d in dirs]
    # the bounds the runs were judged by (a folder without a summary: its files' metadata)
    slos = next((o["goodput_slos_ms"] for o in own if o.get("goodput_slos_ms")), None)
    # the summary: every file folded batch by batch into one (sketches and counts merge)
    fold, damaged = fold_files([f for files in per_dir for f, _, _ in files], slos)
    warnings = merge_warnings(dirs, shards_by_dir, damaged, duplicates, starts, own)
    setup = _shared_setup(own, warnings)
    s = fold.result()
    # duration: the time covered by the runs on the shared axis (shards overlap, resumed runs
    # follow each other: the gap between a stop and its resume is not replay time)
    set_duration(s, _union_s(windows))
    peaks = PeakFold()  # the most requests in flight at once, every folder on the shared axis
    for batch in iter_on_one_axis(list(dirs), ["sent_ns", "end_ns"]):
        peaks.add(batch)
    s.update(peaks.peak(base).fields())
    s.update(setup)
    _pace_settings(s, own)
    s["stopped_early"] = any(o.get("stopped_early") for o in own)  # a stop of one stopped the whole
    s["stop_signal"] = next((o["stop_signal"] for o in own if o.get("stop_signal")), None)
    run_ids = sorted({o["run_id"] for o in own if o.get("run_id")})  # (X-Request-Id prefixes)
    s["run_id"] = run_ids[0] if len(run_ids) == 1 else (run_ids or None)
    _server_sections(s, dirs, own, one_target or isinstance(setup.get("target"), str))
    s.update(_verdicts(list(dirs), s, own))  # (issue 45: the shards judged as one run)
    s["events"] = merged_events(list(dirs), own, base)  # (issue 46: every shard's events)
    s["merged_from"] = list(dirs)
    s["shards"] = [sorted(x)[0] if len(x) == 1 else sorted(x) for x in shards_by_dir]
    s["anchor_spread_s"] = (max(starts) - min(starts)) if starts else None
    s["duplicate_rows"] = duplicates
    s["merge_warnings"] = warnings
    for w in warnings:
        log.warning("merge: %s", w)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        write_json(os.path.join(out_dir, "summary.json"), s)
    if not quiet:
        _print_merged(s)
    return s


def _layout(dirs: list[str], per_dir: list, base: float | None) -> tuple[list[tuple[int, int]], list[set], int]:
    """(each run's first send..last end on the shared axis, each folder's shards, how many trace
    rows more than one folder sent)."""
    keys, shards_by_dir = [], []
    windows: list[tuple[int, int]] = []
    for d, files in zip(dirs, per_dir):
        for anchor, (lo, hi) in run_windows(_files(d), skip_warmup=True).items():  # (warm-up rows left out)
            shift = _shift_ns(float(anchor) if anchor else None, base)
            windows.append((lo + shift, hi + shift))
        shards_by_dir.append({s for _, _, s in files if s})
        keys.append(_sent_rows([f for f, _, _ in files]))
    all_keys = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
    _, counts = np.unique(all_keys, return_counts=True)
    return windows, shards_by_dir, int((counts > 1).sum())


def _shared_setup(own: list[dict], warnings: list[str]) -> dict[str, object]:
    """What the runs shared (``MERGED_SETUP``); a setting they differ in is listed, and warned
    about in ``warnings`` (not one experiment)."""
    setup: dict[str, object] = {}
    for key in MERGED_SETUP:
        values = {json.dumps(o[key], sort_keys=True) for o in own if key in o}
        if len(values) == 1:
            setup[key] = next(o[key] for o in own if key in o)
        elif len(values) > 1:
            setup[key] = [json.loads(v) for v in sorted(values)]
            warnings.append(f"the folders differ in {key}: {', '.join(sorted(values))}")
    return setup


def _server_sections(s: dict, dirs: list[str], own: list[dict], one_target: bool) -> None:
    """The target's scraped view (once, when every folder scraped the same server), and the
    per-tenant and per-target sections over every folder."""
    if one_target:  # its deltas, once: those of the folder that saw most of it
        best = max(own, key=_scrape_coverage)
        for key in ("target_metrics", "server_prefix_cache_hit_tokens", "server_image_cache_hits"):
            if key in best:
                s[key] = best[key]
    if any(o.get("tenants") for o in own):  # a mix: per-tenant sections over every folder
        from replayer.results.tenants import read_tenant_sections

        s["tenants"] = read_tenant_sections(*dirs)
    if any(o.get("targets") for o in own):  # several targets: per-target sections over every folder
        from replayer.results.targets import read_targets

        s["targets"], s["target_switches"] = read_targets(*dirs)


def _print_merged(s: dict) -> None:
    """The merged summary as printed: the table, the verdicts' lines, the targets."""
    print(format_summary(s), flush=True)
    from replayer.results.drift import drift_lines
    from replayer.results.fidelity import fidelity_lines

    for line in fidelity_lines(s.get("fidelity")) + drift_lines(s.get("drift")):
        print(line, flush=True)
    if s.get("targets"):
        from replayer.results.targets import format_targets

        print(format_targets(s["targets"], s.get("target_switches", 0)), flush=True)


def _verdicts(dirs: list[str], s: dict, own: list[dict]) -> dict:
    """The fidelity and drift verdicts of the folders as one run, with the settings their own
    summaries were judged by (the first folder's; the defaults for folders without them)."""
    from replayer.results.fidelity import FidelityBounds
    from replayer.results.verdicts import verdict_sections

    fid = next((o["fidelity"] for o in own if (o.get("fidelity") or {}).get("bounds")), None)
    drift = next((o["drift"] for o in own if (o.get("drift") or {}).get("window_s")), None)
    cap = next((o["concurrency_cap"].get("max_concurrency") for o in own if o.get("concurrency_cap")), None)
    return verdict_sections(
        dirs,
        s,
        bounds=FidelityBounds(max_lag_ms=fid["bounds"]["max_lag_ms"]) if fid else None,
        max_concurrency=cap,
        window_s=drift["window_s"] if drift else 300.0,
        min_change_pct=drift.get("min_change_pct", 10.0) if drift else 10.0,
        reference=(drift.get("reference") or "first") if drift else "first",
    )


def merged_events(dirs: list[str], own: list[dict], base: float | None) -> list[dict]:
    """Every folder's run events (its ``summary.json``'s ``events``) in time order, each with the
    folder it came from (``folder``) and its ``t_s`` on the shared axis (seconds after ``base``,
    the earliest anchor): a fleet's loop boundaries, pauses and stops, shard by shard."""
    out = []
    for d, o in zip(dirs, own):
        for e in o.get("events") or []:
            if not isinstance(e, dict) or not isinstance(e.get("time_s"), (int, float)):
                continue
            rec = {**e, "folder": d}
            if base is not None:
                rec["t_s"] = round(e["time_s"] - base, 3)
            out.append(rec)
    return sorted(out, key=lambda e: e["time_s"])


def _pace_settings(s: dict, own: list[dict]) -> None:
    """The ``--max-concurrency`` cap and the warm-up's rule of the folders' own summaries, beside
    the merged counts of ``s``: the cap is the sum of the folders' (each process's share of the
    run's: ``per_process``), the warm-up's rule the first folder's (it is per process)."""
    for key, rule in (
        ("concurrency_cap", ("max_concurrency",)),
        ("warmup", ("warmup_requests", "warmup_seconds", "boundary")),
    ):
        first = next((o[key] for o in own if isinstance(o.get(key), dict)), None)
        if first is not None:
            s[key] = {**{k: first[k] for k in rule if k in first}, **s.get(key, {})}
    caps = [o["concurrency_cap"].get("max_concurrency") for o in own if isinstance(o.get("concurrency_cap"), dict)]
    if caps and all(isinstance(c, int) for c in caps):  # (issue 47) each process's share: the run's cap is their sum
        s["concurrency_cap"]["max_concurrency"] = sum(caps)
        s["concurrency_cap"]["per_process"] = caps


def _scrape_coverage(summary: dict) -> tuple[float, float, int]:
    """How much of one target's history a folder's scrapes saw: (seconds from its first to its
    last scrape, the last one's time, scrapes). Folders that scraped one server alike differ in
    when they ended: the counters' deltas of the one that covered the most are the run's."""
    tm = summary.get("target_metrics") or {}
    first, last = tm.get("first_scrape_s"), tm.get("last_scrape_s")
    span = last - first if first is not None and last is not None else 0.0
    return span, last or 0.0, tm.get("scrapes", 0)


def main_merge(dirs: list[str], output: str | None, wait_s: float | None = None) -> int:
    """``replayer merge DIR... [-o OUT] [--wait S]``: print the merged summary (and write
    OUT/summary.json). With ``wait_s``: first wait up to that long for every folder's run to
    end by itself. Exit 1 when a folder holds no results, or when the merge is not one whole
    run (a run unfinished or stopped early, shards missing or overlapping: its
    ``merge_warnings``; the summary is written all the same), else 0."""
    if wait_s:
        left = wait_finished(dirs, wait_s)
        if left:
            print(
                f"replayer merge: gave up waiting after {wait_s:g} s for {', '.join(left)}; merging what is there",
                file=sys.stderr,
            )
    try:
        s = merge_results(dirs, output)
    except FileNotFoundError as e:
        print(f"replayer merge: {e}", file=sys.stderr)
        return 1
    except folder_lock.FolderBusy as e:
        print(f"replayer merge: -o {e}", file=sys.stderr)
        return 2
    if output:
        print(f"merged summary: {os.path.join(output, 'summary.json')}", flush=True)
    if s["merge_warnings"]:
        n = len(s["merge_warnings"])
        print(
            f"replayer merge: not one whole run ({n} warning{'s' * (n != 1)} above, also in merge_warnings): exit 1",
            file=sys.stderr,
        )
        return 1
    return 0
