"""A results folder read for the report: the requests folded batch by batch into what the plots need.

Results are read batch by batch, only the columns a plot needs (``ReportData``): time series are
binned counts, CDFs come from ``stats.Stat`` (exact, or sketched for long runs), scatter plots
show a uniform sample of at most ``MAX_POINTS`` requests, so memory does not grow with the run.
Every results file of a folder counts (rolled files and parts, a resumed run's, a ``--workers``
run's worker folders), times rebased to the earliest run anchor (``replayer.results.merge``).
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from replayer.core.result import itl_samples

#: keep plots light (SVG): at most this many points per trace (uniform subsample)
MAX_POINTS = 5_000

#: the results columns the report reads, batch by batch (ITL lists only a batch at a time)
REPORT_COLUMNS = [
    "due_ns",
    "sent_ns",
    "end_ns",
    "outcome",
    "error_kind",
    "ttft_ms",
    "e2e_ms",
    "tpot_ms",
    "dispatch_lag_ms",
    "completion_tokens",
    "prompt_tokens",
    "ttft_from_due_ms",
    "e2el_from_due_ms",
    "itl_ms",
    "itl_counts",
    "warmup",
    "loop",
]


def report_files(results_dir: str) -> list[str]:
    """The results files of a folder (rolled files, parts), or of its ``worker-*`` folders (a
    ``--workers`` run), or of the folders a ``replayer merge -o`` folder was merged from (its
    summary's ``merged_from``: each path as given to merge, else a folder of that name beside
    the merged one, as in a Kubernetes run's ``run-START_AT/``). A damaged file is reported by
    name and left out."""
    from replayer.record.folder import open_file, result_files
    from replayer.results.summary import read_summary

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
        from replayer.core.stats import Stat
        from replayer.results.merge import iter_on_one_axis

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
        self.warmup_rows = 0  # warm-up requests: counted, plotted apart, in no distribution
        self.loop_starts: dict[int, float] = {}  # loop -> its first due time (s): the report marks the boundaries
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
        if "loop" in b.schema.names:
            self._loop_starts(b.column("loop").to_numpy(zero_copy_only=False), due)
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
        warm = np.zeros(b.num_rows, dtype=bool)
        if "warmup" in b.schema.names:  # (warm-up rows: in the counts over time, out of the CDFs)
            warm = pc.fill_null(b.column("warmup"), False).to_numpy(zero_copy_only=False)
            self.warmup_rows += int(warm.sum())
        if ok.any():
            self.ok_sample.add({"sent_s": sent[ok], "ttft_ms": ttft, "e2e_ms": e2e, "warmup": warm[ok]})
        ok = ok & ~warm
        ttft, e2e = f("ttft_ms")[ok], f("e2e_ms")[ok]
        self.latency["TTFT"].add(ttft / 1e3)
        self.latency["E2E"].add(e2e / 1e3)
        self.latency["TPOT"].add(f("tpot_ms")[ok] / 1e3)
        self.latency["ITL (token-weighted)"].add(itl_samples(b, ok) / 1e3)  # (either ITL form)
        if "ttft_from_due_ms" in b.schema.names:
            self.has_from_due = True
            self.from_due["TTFT from the due time"].add(f("ttft_from_due_ms")[ok] / 1e3)
            self.from_due["E2E from the due time"].add(f("e2el_from_due_ms")[ok] / 1e3)
        was_sent = ~np.isnan(sent)
        if was_sent.any():
            self.sent_sample.add(
                {"sent_s": sent[was_sent], "due_s": due[was_sent], "dispatch_lag_ms": f("dispatch_lag_ms")[was_sent]}
            )

    def _loop_starts(self, loops: np.ndarray, due: np.ndarray) -> None:
        for k in np.unique(loops):
            first = float(np.nanmin(due[loops == k])) if (~np.isnan(due[loops == k])).any() else None
            if first is not None:
                self.loop_starts[int(k)] = min(self.loop_starts.get(int(k), first), first)

    def __len__(self) -> int:
        return self.rows


def load_results(results_dir: str) -> tuple["ReportData", dict, dict]:
    """(the folded ``ReportData``, summary dict, parquet metadata dict of the first file) of a
    results folder: every results file (``report_files``), times rebased to the earliest run
    anchor (a resumed run or a worker has an anchor of its own; ``replayer.results.merge``). A folder
    without ``summary.json`` is summarized from its files (``summary.summarize_files``, judged
    by the run's own ``--goodput`` bounds from their metadata)."""
    from replayer.results.summary import read_summary, summarize_files

    files = report_files(results_dir)
    if not files:
        raise FileNotFoundError(f"no results files (requests*.parquet) in {results_dir}")
    meta = {
        k.decode(): v.decode()
        for k, v in (pq.read_schema(files[0]).metadata or {}).items()
        if not k.startswith(b"ARROW")
    }
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
