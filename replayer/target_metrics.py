"""Scrape the target's Prometheus ``/metrics`` (vLLM names) during a replay.

Pure part (no I/O): ``parse_series(text)`` picks the known series out of one exposition text;
``aggregate(series)`` combines them into flat values; ``parse_vllm_metrics(text)`` does both;
``series_deltas(before, after)`` gives per-series increases with counter resets handled.
Async shell: ``TargetScraper`` polls ``/metrics`` every ``interval_s``, keeps long-format sample
rows for the caller to flush (``SampleFiles``: parts during the run, ``target_metrics.parquet``
at its end) and the counter
increases over the whole run (``deltas()``).

Rules (shared/cases/client-faults.md):

* Samples are chosen by **exact sample name** (``vllm:prompt_tokens_total``), never by prefix.
  The text parser strips ``_total`` from a counter's *family* name (B23), so matching is done on
  sample names, which keep it. ``X_created`` samples (the counter's creation time, Unix s, ~1.7e9)
  are never values (B03); they are kept apart and used only to detect resets (B20). Histograms
  contribute only their exact ``_sum``/``_count`` samples.
* Series are combined with ONE explicit keyed sum: the key is the canonical name plus the KEPT
  labels (``position`` for the per-position acceptance counter); every other label (``engine``,
  ``dp_rank``, ``pod``, ``instance``, ``model_name``, ``finished_reason``...) is summed over
  (B19). One target serves one model in a replay, so ``model_name`` is summed; the raw series in
  ``TargetScraper.samples`` keep every label for an offline breakdown. The result does not depend
  on line order. ``kv_cache_usage_perc`` is a fraction per engine: its aggregate is the mean over
  series, not the sum.
* A counter series that decreases, or whose ``_created`` changed, was reset (server restart): its
  increase over that interval is its new value, not a negative difference (B20). Resets are found
  per raw series (per engine) *before* summing, so one engine's reset cannot hide behind another
  engine's growth.
* A known metric the target does not report is left out, never 0: the first good scrape logs the
  missing ones by name (one warning line), and ``TargetScraper.missing`` lists those no scrape of
  the run has had (``target_metrics.missing`` in the summary). A counter reset is logged when
  the scrape that sees it arrives.
* Derived values: ``spec_decode_acceptance_rate`` = accepted / draft tokens;
  ``spec_decode_mean_acceptance_length`` = 1 + accepted / drafts;
  ``spec_decode_acceptance_rate_per_pos{position="k"}`` = accepted at k (summed over engines) /
  drafts (B03, B19); ``prefix_cache_hit_rate`` = hits / queries; ``server_mean_ttft_seconds`` etc.
  = ``_sum / _count``. A ratio with a zero or missing denominator is left out (never 0, never NaN).

Metric names: vLLM V1 ``vllm/v1/metrics/loggers.py`` (``vllm:prefix_cache_queries``/``hits``,
``vllm:kv_cache_usage_perc``, ``vllm:spec_decode_*``); the older names ``vllm:gpu_prefix_cache_*``
and ``vllm:gpu_cache_usage_perc`` are accepted when the new ones are absent (never both summed).
"""

from __future__ import annotations

import asyncio
import glob
import json
import logging
import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

__all__ = ["COUNTERS", "GAUGES", "SeriesKey", "parse_series", "aggregate", "parse_vllm_metrics",
           "series_deltas", "check_invariants", "TargetScraper", "save_samples", "SampleFiles",
           "sample_files", "read_samples"]

#: canonical name -> accepted sample names, in order of preference (the first one present wins)
COUNTERS: dict[str, tuple[str, ...]] = {
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "request_success": ("vllm:request_success_total",),
    "num_preemptions": ("vllm:num_preemptions_total",),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "mm_cache_queries": ("vllm:mm_cache_queries_total",),
    "mm_cache_hits": ("vllm:mm_cache_hits_total",),
    "spec_decode_num_drafts": ("vllm:spec_decode_num_drafts_total",),
    "spec_decode_num_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_decode_num_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
    "spec_decode_num_accepted_tokens_per_pos": ("vllm:spec_decode_num_accepted_tokens_per_pos_total",),
    # histogram sums and counts are counters too (exact _sum / _count samples only)
    "server_ttft_seconds_sum": ("vllm:time_to_first_token_seconds_sum",),
    "server_ttft_seconds_count": ("vllm:time_to_first_token_seconds_count",),
    "server_e2e_seconds_sum": ("vllm:e2e_request_latency_seconds_sum",),
    "server_e2e_seconds_count": ("vllm:e2e_request_latency_seconds_count",),
    "server_queue_seconds_sum": ("vllm:request_queue_time_seconds_sum",),
    "server_queue_seconds_count": ("vllm:request_queue_time_seconds_count",),
}
#: gauges: canonical name -> accepted sample names (first present wins)
GAUGES: dict[str, tuple[str, ...]] = {
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
#: labels kept in the aggregate key (all others are summed over)
KEPT_LABELS: dict[str, tuple[str, ...]] = {"spec_decode_num_accepted_tokens_per_pos": ("position",)}
#: gauges aggregated by the mean over series (fractions), not the sum
MEAN_GAUGES = frozenset({"kv_cache_usage_perc"})

_CANON: dict[str, tuple[str, str, int]] = {}  # sample name -> (canonical, kind, preference)
for _kind, _table in (("counter", COUNTERS), ("gauge", GAUGES)):
    for _c, _names in _table.items():
        for _rank, _n in enumerate(_names):
            _CANON[_n] = (_c, _kind, _rank)
_CREATED = {n[: -len("_total")] + "_created": n for n in _CANON if n.endswith("_total")}

#: (sample name, sorted (label, value) pairs) identifying one raw series
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


def parse_series(text: str) -> tuple[dict[SeriesKey, float], dict[SeriesKey, float]]:
    """The known series of one ``/metrics`` text.

    Returns ``(values, created)``: ``values`` maps each raw series of a known sample name (see
    ``COUNTERS``/``GAUGES``) to its value; ``created`` maps the counter series that have a
    ``_created`` companion to that creation time (Unix s). Unknown samples are ignored; NaN
    values are dropped. Raises ``ValueError`` for text the Prometheus parser rejects.
    """
    values: dict[SeriesKey, float] = {}
    created: dict[SeriesKey, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            if name in _CANON:
                target = values
            elif name in _CREATED:
                name = _CREATED[name]
                target = created
            else:
                continue
            v = float(s.value)
            if math.isnan(v):
                continue
            target[(name, tuple(sorted(s.labels.items())))] = v
    return values, created


def _agg_key(canon: str, labels: tuple[tuple[str, str], ...]) -> str:
    kept = KEPT_LABELS.get(canon)
    if not kept:
        return canon
    d = dict(labels)
    return canon + "{" + ",".join(f'{k}="{d.get(k, "")}"' for k in kept) + "}"


def aggregate(values: Mapping[SeriesKey, float], *, derive: bool = True) -> dict[str, float]:
    """Flat values from raw series: one keyed sum per canonical name (+ kept labels), using only
    the most preferred sample name present for each canonical name; gauges in ``MEAN_GAUGES``
    averaged. With ``derive``, adds the ratios listed in the module docstring.

    Keys: canonical names (``"prompt_tokens"``), or with kept labels
    (``'spec_decode_num_accepted_tokens_per_pos{position="0"}'``).
    """
    best: dict[str, int] = {}
    for name, _ in values:
        canon, _kind, rank = _CANON[name]
        if rank < best.get(canon, 99):
            best[canon] = rank
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for (name, labels), v in values.items():
        canon, _kind, rank = _CANON[name]
        if rank != best[canon]:
            continue
        key = _agg_key(canon, labels)
        sums[key] += v
        counts[key] += 1
    out = {k: (v / counts[k] if k in MEAN_GAUGES else v) for k, v in sums.items()}
    if derive:
        out.update(_derived(out))
    return out


def _ratio(out: dict[str, float], key: str, num: float | None, den: float | None, plus: float = 0.0) -> None:
    if num is not None and den:
        out[key] = plus + num / den


def _derived(v: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    acc, drafts, dtok = (v.get("spec_decode_num_accepted_tokens"), v.get("spec_decode_num_drafts"),
                         v.get("spec_decode_num_draft_tokens"))
    _ratio(out, "spec_decode_acceptance_rate", acc, dtok)
    _ratio(out, "spec_decode_mean_acceptance_length", acc, drafts, plus=1.0)
    prefix = "spec_decode_num_accepted_tokens_per_pos{"
    for k, val in v.items():
        if k.startswith(prefix):
            _ratio(out, "spec_decode_acceptance_rate_per_pos{" + k[len(prefix):], val, drafts)
    _ratio(out, "prefix_cache_hit_rate", v.get("prefix_cache_hits"), v.get("prefix_cache_queries"))
    _ratio(out, "mm_cache_hit_rate", v.get("mm_cache_hits"), v.get("mm_cache_queries"))
    for what in ("ttft", "e2e", "queue"):
        _ratio(out, f"server_mean_{what}_seconds", v.get(f"server_{what}_seconds_sum"),
               v.get(f"server_{what}_seconds_count"))
    return out


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """Aggregated values (and derived ratios) of one ``/metrics`` text; see ``aggregate``.
    Raises ``ValueError`` for unparsable text."""
    return aggregate(parse_series(text)[0])


def _is_counter(key: SeriesKey) -> bool:
    return _CANON[key[0]][1] == "counter"


def series_deltas(before: Mapping[SeriesKey, float], after: Mapping[SeriesKey, float],
                  created_before: Mapping[SeriesKey, float] | None = None,
                  created_after: Mapping[SeriesKey, float] | None = None) -> dict[SeriesKey, float]:
    """Per-series counter increase from ``before`` to ``after`` (gauges are skipped).

    A series that decreased, or whose ``_created`` time changed, was reset: its increase is its
    value in ``after`` (B20). A series absent from ``before`` (a new engine) counts its whole value;
    one absent from ``after`` contributes nothing.
    """
    cb = created_before or {}
    ca = created_after or {}
    out: dict[SeriesKey, float] = {}
    for key, v in after.items():
        if not _is_counter(key):
            continue
        prev = before.get(key)
        if prev is None or _is_reset(prev, v, cb.get(key), ca.get(key)):
            out[key] = v
        else:
            out[key] = v - prev
    return out


def _is_reset(prev: float, value: float, created_prev: float | None, created_now: float | None) -> bool:
    return value < prev or (created_prev is not None and created_now is not None and created_prev != created_now)


def check_invariants(agg: Mapping[str, float]) -> list[str]:
    """Problems between related aggregated counters (empty list when consistent): the
    per-position accepted tokens must add up to the accepted total (B19); hits <= queries."""
    problems = []
    prefix = "spec_decode_num_accepted_tokens_per_pos{"
    per_pos = [v for k, v in agg.items() if k.startswith(prefix)]
    total = agg.get("spec_decode_num_accepted_tokens")
    if per_pos and total is not None and abs(sum(per_pos) - total) > 1e-9 * max(1.0, total):
        problems.append(f"per-position accepted tokens sum to {sum(per_pos):g}, total is {total:g}")
    h, q = agg.get("prefix_cache_hits"), agg.get("prefix_cache_queries")
    if h is not None and q is not None and h > q:
        problems.append(f"prefix cache hits {h:g} exceed queries {q:g}")
    return problems


class TargetScraper:
    """Polls ``metrics_url`` every ``interval_s`` seconds until cancelled.

    ``session``: an ``aiohttp.ClientSession`` to use (not closed here); None creates one for
    ``run``. ``t0_ns``: the run anchor on ``replayer.clock.now_ns``'s clock (row field ``t_ns``
    is the offset from it). ``wall``/``mono``: injectable clocks (Unix s / int ns).

    After each successful scrape: ``latest`` (aggregated values, see ``aggregate``), one row per
    raw series appended to ``samples`` (``{"time_s", "t_ns", "metric", "labels", "kind",
    "value"}``; ``labels`` is a JSON object text; the caller takes and flushes them with
    ``take_samples``), and the per-series increases since the previous scrape are added to the
    run totals (``deltas()``). A failed scrape (connection, status, parse) is counted in
    ``errors`` with ``last_error`` and never raises; the next good scrape's increases are taken
    against the last good one. ``missing``: the canonical names (``COUNTERS``/``GAUGES``) no good
    scrape has had so far, logged at the first one (None before it).
    """

    def __init__(self, metrics_url: str, *, session: aiohttp.ClientSession | None = None,
                 interval_s: float = 5.0, timeout_s: float = 10.0, t0_ns: int = 0,
                 wall: Callable[[], float] = time.time, mono: Callable[[], int] = time.perf_counter_ns) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.url = metrics_url
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.t0_ns = t0_ns
        self._session = session
        self._wall = wall
        self._mono = mono
        self.samples: list[dict] = []
        self._samples_lock = threading.Lock()
        self.latest: dict[str, float] = {}
        self.scrapes = 0
        self.first_time_s: float | None = None  # wall time (Unix s) of this run's first / last good scrape
        self.last_time_s: float | None = None
        self.errors = 0
        self.last_error: str | None = None
        self.resets = 0         # scrape intervals in which counters went back (a restart: once)
        self.series_resets = 0  # counter series that went back, over all of them
        self.missing: list[str] | None = None
        self._prev: dict[SeriesKey, float] | None = None
        self._prev_created: dict[SeriesKey, float] = {}
        self._run: dict[SeriesKey, float] = defaultdict(float)

    # -- pure step (also used by tests) ---------------------------------------------------------
    def observe(self, text: str, time_s: float | None = None, t_ns: int | None = None) -> dict[str, float]:
        """Take one scrape's text: update rows, run totals and ``latest``; return ``latest``.
        Raises ValueError for unparsable text (nothing is changed then)."""
        values, created = parse_series(text)
        time_s = self._wall() if time_s is None else time_s
        t_ns = self._mono() - self.t0_ns if t_ns is None else t_ns
        rows = [{"time_s": time_s, "t_ns": t_ns, "metric": name, "labels": json.dumps(dict(labels), sort_keys=True),
                 "kind": _CANON[name][1], "value": v} for (name, labels), v in values.items()]
        with self._samples_lock:  # (take_samples runs on the loop thread, this in a worker)
            self.samples.extend(rows)
        if self._prev is not None:
            prev, pc = self._prev, self._prev_created
            n = 0
            # a new dict, swapped in whole: the loop thread may be reading series_totals() while
            # this runs in a worker thread (a dict growing under its iteration raises)
            run = defaultdict(float, self._run)
            reset: list[str] = []
            for key, inc in series_deltas(prev, values, pc, created).items():
                run[key] += inc
                if key in prev and _is_reset(prev[key], values[key], pc.get(key), created.get(key)):
                    n += 1
                    reset.append(key[0])
            self._run = run
            self.series_resets += n
            self.resets += n > 0
            if n:
                log.warning("target counters went back between two scrapes of %s (a server restart?): %d series "
                            "reset (%s); their increase is taken from their new values", self.url, n,
                            ", ".join(sorted(set(reset))))
        self._prev, self._prev_created = values, created
        self._note_missing(values)
        self.latest = aggregate(values)
        self.scrapes += 1
        if self.first_time_s is None:
            self.first_time_s = time_s
        self.last_time_s = time_s
        return self.latest

    def _note_missing(self, values: Mapping[SeriesKey, float]) -> None:
        """Update ``missing`` from one good scrape; log the missing names at the first one."""
        present = {_CANON[name][0] for name, _ in values}
        if self.missing is None:
            self.missing = sorted((set(COUNTERS) | set(GAUGES)) - present)
            if self.missing:
                log.warning("target metrics missing from %s (left out of the summary, never 0): %s",
                            self.url, ", ".join(self.missing))
        elif self.missing:
            self.missing = [m for m in self.missing if m not in present]

    def series_totals(self) -> list[list]:
        """The run's counter increases per raw series, as JSON-able ``[name, labels, value]``
        (``add_totals`` takes them back: a resumed run's deltas then cover every run)."""
        return [[name, dict(labels), v] for (name, labels), v in self._run.items()]

    def add_totals(self, totals: list, *, scrapes: int = 0, errors: int = 0, resets: int = 0,
                   series_resets: int = 0) -> None:
        """Start from an earlier run's ``series_totals`` and counts (``--resume``)."""
        for name, labels, v in totals:
            self._run[(name, tuple(sorted(labels.items())))] += float(v)
        self.scrapes += scrapes
        self.errors += errors
        self.resets += resets
        self.series_resets += series_resets

    def deltas(self) -> dict[str, float]:
        """Counter increases over the run (first to last good scrape), aggregated like
        ``aggregate`` with derived ratios over the run (e.g. the run's acceptance rate)."""
        return aggregate(dict(self._run))

    def take_samples(self) -> list[dict]:
        """Return the rows gathered since the last call and clear them."""
        with self._samples_lock:
            rows, self.samples = self.samples, []
        return rows

    # -- I/O -------------------------------------------------------------------------------------
    async def scrape_once(self, session: aiohttp.ClientSession | None = None) -> dict[str, float] | None:
        """GET the metrics once and ``observe`` it; None (and ``errors`` += 1) on failure."""
        session = session or self._session
        assert session is not None, "no aiohttp session"
        try:
            async with session.get(self.url, timeout=self.timeout) as r:
                text = await r.text()
                if r.status != 200:
                    raise ValueError(f"HTTP {r.status}: {text[:200]}")
            # prometheus_client's parser is pure Python (~10-30 ms for a vLLM page): off the loop
            return await asyncio.get_running_loop().run_in_executor(None, self.observe, text)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a scrape failure must not stop the replay
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"[:500]
            log.debug("scrape of %s failed: %s", self.url, self.last_error)
            return None

    async def run(self) -> None:
        """Scrape at ``interval_s`` on absolute deadlines (no drift) until cancelled."""
        own = self._session is None
        session = self._session or aiohttp.ClientSession()
        try:
            start = self._mono()
            k = 0
            while True:
                await self.scrape_once(session)
                k += 1
                left = start + int(k * self.interval_s * 1e9) - self._mono()
                if left < 0:  # a slow scrape: skip the missed ticks rather than burst
                    k += -left // int(self.interval_s * 1e9) + 1
                    left = start + int(k * self.interval_s * 1e9) - self._mono()
                await asyncio.sleep(left / 1e9)
        finally:
            if own:
                await session.close()


SAMPLES_FILE = "target_metrics.parquet"
SAMPLES_FLUSH_SCRAPES = 12  # samples reach a part file every this many scrape intervals (a SIGKILL loses at most that)
SAMPLES_ROLL_PARTS = 60  # parts on disk that trigger a roll during the run (an hour at the soak's 5 s scrapes)
_PARTS = "parts"  # the results folder's parts folder (``replayer.recorder.PARTS``)


def _sample_schema():
    import pyarrow as pa

    return pa.schema([("time_s", pa.float64()), ("t_ns", pa.int64()), ("metric", pa.string()),
                      ("labels", pa.string()), ("kind", pa.string()), ("value", pa.float64())])


def save_samples(rows: list[dict], path: str) -> None:
    """Write sample rows (``TargetScraper.samples`` format) to Parquet, long format: columns
    ``time_s`` (float64, Unix s), ``t_ns`` (int64, ns after the run anchor), ``metric`` (the raw
    sample name, e.g. ``vllm:prompt_tokens_total``), ``labels`` (JSON object text, every label),
    ``kind`` ("counter"/"gauge"), ``value`` (float64). Written to a temporary name, fsynced, then
    renamed (``recorder.atomic_file``): a file on disk is always whole."""
    import pyarrow.parquet as pq

    from .recorder import atomic_file

    table = _samples_table(rows)
    with atomic_file(path) as f:
        pq.write_table(table, f, compression="zstd")


def _samples_table(rows: list[dict]):
    """Sample rows as an Arrow table of ``_sample_schema()``."""
    import pyarrow as pa

    schema = _sample_schema()
    return pa.table({f.name: [r[f.name] for r in rows] for f in schema}, schema=schema)


def sample_files(results_dir: str) -> list[str]:
    """The target-metric sample files of a results folder: ``target_metrics.parquet``, then the
    parts not yet rolled into it (``parts/target_metrics-NNNNNNNN.parquet``: a run still going,
    or one killed before its end; a part that ``target_metrics.parquet`` lists as rolled into it
    is left out: a roll was cut short before removing it)."""
    rolled = os.path.join(results_dir, SAMPLES_FILE)
    parts = sorted(glob.glob(os.path.join(results_dir, _PARTS, "target_metrics-*.parquet")))
    covered = _rolled_parts(rolled)
    return ([rolled] if os.path.exists(rolled) else []) + [p for p in parts if os.path.basename(p) not in covered]


def _rolled_parts(rolled: str) -> set[str]:
    """Names of the parts ``target_metrics.parquet`` holds (empty when there is none)."""
    import pyarrow.parquet as pq

    from .recorder import ROLLED_PARTS

    if not os.path.exists(rolled):
        return set()
    names = (pq.read_schema(rolled).metadata or {}).get(ROLLED_PARTS)
    return set(json.loads(names)) if names else set()


def read_samples(results_dir: str):
    """Every target-metric sample of a results folder as one Arrow table (``save_samples``'s
    columns), or None when it has none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sample_files(results_dir)
    if not files:
        return None
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")


class SampleFiles:
    """The scraper's samples on disk, so that nothing scraped is lost: ``write_part`` (every
    ``SAMPLES_FLUSH_SCRAPES`` scrape intervals during the run) writes a small whole Parquet file under
    ``parts/``; ``roll`` merges ``target_metrics.parquet`` (an earlier roll's, or an earlier run's on
    ``--resume``), every part (also those a killed run left) and the given rows into a new
    ``target_metrics.parquet``, batch by batch, then removes the parts. The run rolls at its end,
    and ``write_part`` rolls once ``roll_parts`` parts are on disk, so a days-long soak keeps one
    file, not one per minute.

    ``keep_since`` (-> Unix s or None) bounds the file: a roll leaves out samples older than it
    returns. The run passes the oldest results kept once retention has removed results
    (``retention.samples_kept_since``), so the samples cover what the results cover and stay
    inside the retention bound. Blocking: call from a worker thread, one call at a time."""

    def __init__(self, results_dir: str, *, keep_since: Callable[[], float | None] | None = None,
                 roll_parts: int = SAMPLES_ROLL_PARTS) -> None:
        self.dir = results_dir
        self.keep_since = keep_since
        self.roll_parts = roll_parts
        os.makedirs(os.path.join(results_dir, _PARTS), exist_ok=True)
        # part names are never reused: target_metrics.parquet's list of parts must not name a new one
        names = [os.path.basename(p) for p in glob.glob(os.path.join(results_dir, _PARTS, "target_metrics-*.parquet"))]
        self._parts = len(names)
        names += _rolled_parts(os.path.join(results_dir, SAMPLES_FILE))
        self._seq = 1 + max((int(n[-16:-8]) for n in names if n[-16:-8].isdigit()), default=-1)

    def write_part(self, rows: list[dict]) -> str | None:
        """Write ``rows`` as the next part file (then roll, when ``roll_parts`` are on disk);
        returns the part's path (None for no rows)."""
        if not rows:
            return None
        os.makedirs(os.path.join(self.dir, _PARTS), exist_ok=True)
        path = os.path.join(self.dir, _PARTS, f"target_metrics-{self._seq:08d}.parquet")
        self._seq += 1
        save_samples(rows, path)
        self._parts += 1
        if self._parts >= self.roll_parts:
            self.roll()
        return path

    def roll(self, rows: list[dict] | tuple = ()) -> int:
        """Merge everything into ``target_metrics.parquet`` (see the class docstring); returns
        its row count (0, and no file, when there are no samples)."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from .recorder import ROLLED_PARTS, atomic_file

        files = sample_files(self.dir)
        if not files and not rows:
            return 0
        dst = os.path.join(self.dir, SAMPLES_FILE)
        parts = glob.glob(os.path.join(self.dir, _PARTS, "target_metrics-*.parquet"))
        # the parts merged now (and any a cut-short roll left): from the rename on, readers skip
        # them (a kill before their removal shows no sample twice); the parts a finished roll
        # merged are gone, so the list stays as short as the parts on disk
        rolled = sorted({os.path.basename(p) for p in parts})
        since = self.keep_since() if self.keep_since is not None else None
        schema, n = _sample_schema(), 0
        with atomic_file(dst) as out:
            with pq.ParquetWriter(out, schema.with_metadata({ROLLED_PARTS: json.dumps(rolled).encode()}),
                                  compression="zstd") as w:
                for table in self._sources(files, rows):
                    if since is not None:
                        table = table.filter(pc.greater_equal(table.column("time_s"), since))
                    if table.num_rows:
                        w.write_table(table)
                        n += table.num_rows
        for f in parts:
            os.remove(f)
        self._parts = 0
        try:  # (the results' parts went first: nothing left in parts/ then)
            os.rmdir(os.path.join(self.dir, _PARTS))
        except OSError:
            pass
        return n

    @staticmethod
    def _sources(files: list[str], rows: list[dict] | tuple) -> Iterator:
        """The samples to merge as Arrow tables of ``_sample_schema()``, in order, batch by batch."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = _sample_schema()
        for f in files:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=65_536):
                yield pa.Table.from_batches([batch.cast(schema)])
        if rows:
            yield _samples_table(list(rows))
