"""The regression gate's statistics: a candidate run judged against a baseline run of the same
trace, request by request at equal trace position.

Why paired: both runs sent the same requests (the same trace rows, the same prompts, the same due
offsets), so the workload's own ups and downs (a burst at minute 7, a run of long prompts) are
in both and cancel in the comparison. The requests are paired by their trace identity, ``(loop,
row)``, and cut into ``blocks`` of consecutive pairs (trace order is time order). A resample draws
blocks with replacement and weighs *both* runs' requests by the same draw, so each resampled
change compares the same requests; whole blocks keep the autocorrelation of latency in time (a
slow second on the host slows the requests around it, not one at random), which resampling
single requests would hide and so understate the noise.

For a latency quantile the change is relative (candidate / baseline - 1, percent); for a share
(error rate, goodput as SLO attainment) it is the difference in percentage points. The interval is
the bootstrap's percentile interval at ``confidence``. A metric **regressed** when the whole
interval is past its minimum effect in the bad direction, **improved** when it is past it in the
good direction, and otherwise **held**: a change the runs cannot tell apart from noise, or one
too small to matter, never fails the gate.

Quantiles of resamples are read off histograms with log-spaced bins 0.2 % wide (a block's
histogram is summed once; a resample is one matrix product), so a resample costs the bins, not
the requests: the requests are read, binned and selected once per run and column. The point
estimate is the exact nearest-rank quantile, as the summary's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replayer.results.gatespec import GateSpec, MetricSpec
from replayer.results.gatestall import stall_prone, transient

#: the results columns the gate reads
COLUMNS = [
    "row",
    "loop",
    "warmup",
    "outcome",
    "input_length",
    "output_length",
    "due_ns",
    "completion_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "ttft_from_due_ms",
    "e2el_from_due_ms",
    "itl_ms",
    "itl_counts",
]
#: relative width of a histogram bin (0.2 %: far below any minimum effect worth gating on)
BIN_WIDTH = 0.002
#: values a quantile needs beyond it in each run to be judged (p99: 500 values): the bootstrap of
#: a quantile that only a handful of values decide understates its spread
MIN_TAIL = 5
#: outcomes judged for the error rate (cancelled and never-started requests are the run's stop, not the server's)
_JUDGED = ("success", "failed")


class NotComparable(ValueError):
    """The two runs cannot be judged against each other (different traces or slices, too few
    requests); the message says which and why."""


@dataclass
class Paired:
    """Both runs' requests in pair order (by ``(loop, row)``): ``base`` and ``cand`` tables of one
    length, row i of each the same trace request."""

    base: pa.Table
    cand: pa.Table

    @property
    def n(self) -> int:
        return self.base.num_rows


@dataclass
class MetricResult:
    """One metric's judgement: the values (ms, or a share 0-1), the change (percent, or percentage
    points), its interval, the verdict (regressed / improved / held / not judged) and why."""

    spec: MetricSpec
    baseline: float | None
    candidate: float | None
    change: float | None
    low: float | None
    high: float | None
    verdict: str
    reason: str = ""

    def as_dict(self) -> dict:
        s = self.spec
        return {
            "metric": s.name,
            "label": s.label,
            "direction": s.direction,
            "unit": "percent" if s.relative else "percentage_points",
            "min_effect": s.min_effect,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "change": self.change,
            "interval": None if self.low is None else [self.low, self.high],
            "verdict": self.verdict,
            "reason": self.reason,
        }


def _keys(t: pa.Table) -> np.ndarray:
    """One int64 per request: its trace identity (loop, row)."""
    loop = t.column("loop").to_numpy(zero_copy_only=False).astype(np.int64)
    row = t.column("row").to_numpy(zero_copy_only=False).astype(np.int64)
    out: np.ndarray = (loop << 40) | row
    return out


def _describe(keys: np.ndarray) -> str:
    loops = np.unique(keys >> 40)
    rows = keys & ((1 << 40) - 1)
    span = f"rows {rows.min()}-{rows.max()}" if len(rows) else "no rows"
    return f"{len(keys)} requests ({span}{f', {len(loops)} loops' if len(loops) > 1 else ''})"


def pair(base: pa.Table, cand: pa.Table) -> Paired:
    """Both runs' non-warm-up requests (results tables with ``COLUMNS``) paired by trace identity.
    Raises ``NotComparable`` when they did not replay the same slice of the same trace: other
    requests (a different ``--duration``, ``--max-requests``, shard or loop count), other lengths
    at the same rows (another trace) or other due offsets (another speed-up or loop gap)."""
    tables = []
    for t in (base, cand):
        if "warmup" in t.column_names:
            t = t.filter(pc.invert(pc.fill_null(t.column("warmup"), False)))
        k = _keys(t)
        order = np.argsort(k, kind="stable")
        tables.append((t.take(pa.array(order)), k[order]))
    (tb, kb), (tc, kc) = tables
    if len(kb) != len(kc) or not np.array_equal(kb, kc):
        common = len(np.intersect1d(kb, kc))
        raise NotComparable(
            f"different slices of the trace: the baseline has {_describe(kb)}, the candidate {_describe(kc)}, "
            f"{common} in common (replay the same trace with the same --duration/--max-requests/--loop/--shard)"
        )
    for col in ("input_length", "output_length"):
        a = tb.column(col).to_numpy(zero_copy_only=False)
        b = tc.column(col).to_numpy(zero_copy_only=False)
        differ = np.flatnonzero(a != b)
        if len(differ):
            i = int(differ[0])
            raise NotComparable(
                f"different traces: {len(differ)} of {len(a)} requests differ in {col} "
                f"(first: row {int(kb[i] & ((1 << 40) - 1))}: {a[i]} in the baseline, {b[i]} in the candidate)"
            )
    _same_schedule(tb, tc)
    return Paired(tb, tc)


def _same_schedule(tb: pa.Table, tc: pa.Table) -> None:
    """Raise ``NotComparable`` when the paired requests were due at other offsets (another
    speed-up, loop gap or idle-gap cap): the same requests at another rate are another load."""
    db = tb.column("due_ns").to_numpy(zero_copy_only=False).astype(np.float64)
    dc = tc.column("due_ns").to_numpy(zero_copy_only=False).astype(np.float64)
    if len(db) < 2:
        return
    sb, sc = db - db.min(), dc - dc.min()
    span_b, span_c = sb.max(), sc.max()
    if span_b <= 0 and span_c <= 0:
        return
    worst = float(np.max(np.abs(sb - sc)))
    if worst > 0.01 * max(span_b, span_c) + 1e6:  # 1 % of the span and 1 ms
        raise NotComparable(
            f"different schedules: the same requests spread over {span_b / 1e9:.3f} s of replay in the "
            f"baseline and {span_c / 1e9:.3f} s in the candidate (another --speedup, --loop-gap or --idle-gap-cap)"
        )


def _f64(t: pa.Table, col: str) -> np.ndarray:
    return np.asarray(t.column(col).to_numpy(zero_copy_only=False), dtype=np.float64)


def _success(t: pa.Table) -> np.ndarray:
    return np.asarray(pc.equal(t.column("outcome"), "success").to_numpy(zero_copy_only=False), dtype=bool)


def _samples(t: pa.Table, spec: MetricSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A latency's samples of one run: (values ms, pair index of each, weight of each): a
    successful request's value (unknown left out), or every ITL gap of it (a compact ITL's
    values with their counts as weights)."""
    ok = _success(t)
    if spec.column != "itl_ms":
        v = _f64(t, str(spec.column))
        keep = ok & ~np.isnan(v)
        idx = np.flatnonzero(keep)
        return v[idx], idx, np.ones(len(idx))
    lists = t.column("itl_ms")
    lens = pc.list_value_length(lists).to_numpy(zero_copy_only=False)
    lens = np.where(np.isnan(lens.astype(np.float64)), 0, lens).astype(np.int64)
    values = np.asarray(pc.list_flatten(lists).to_numpy(zero_copy_only=False), dtype=np.float64)
    owner = np.repeat(np.arange(t.num_rows), lens)
    weights = np.ones(len(values))
    counts = t.column("itl_counts") if "itl_counts" in t.column_names else None
    if counts is not None and counts.null_count < len(counts):
        per_row = counts.to_pylist()
        weights = np.concatenate(
            [np.ones(n) if c is None else np.asarray(c, np.float64) for n, c in zip(lens, per_row)] or [np.zeros(0)]
        )
    keep = ok[owner] & ~np.isnan(values)
    return values[keep], owner[keep], weights[keep]


def _nearest_rank(values: np.ndarray, weights: np.ndarray, q: float) -> float | None:
    """The nearest-rank ``q``-th percentile of weighted values (None when there are none)."""
    total = weights.sum()
    if total <= 0:
        return None
    if total == len(values):  # (unit weights: a selection, not a sort)
        k = min(len(values), max(1, math.ceil(q / 100 * total - 1e-9))) - 1
        return float(np.partition(values, k)[k])
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    rank = min(total, max(1.0, math.ceil(q / 100 * total - 1e-9)))
    return float(values[order][np.searchsorted(cum, rank - 1e-9)])


def _block_hist(
    values: np.ndarray, blocks: np.ndarray, weights: np.ndarray, lo: float, n_bins: int, k: int
) -> np.ndarray:
    """(k, n_bins) weighted histogram of ``values`` per block on the log grid from ``lo``."""
    idx = np.clip((np.log(np.maximum(values, lo) / lo) / math.log1p(BIN_WIDTH)).astype(np.int64), 0, n_bins - 1)
    h = np.bincount(blocks * n_bins + idx, weights=weights, minlength=k * n_bins)
    return h.reshape(k, n_bins)


def _resampled_quantiles(hist: np.ndarray, draws: np.ndarray, q: float, lo: float) -> np.ndarray:
    """Per resample (a row of ``draws``: how often each block was drawn), the nearest-rank
    ``q``-th percentile read off the summed histograms (the bin's geometric middle; NaN when the
    resample holds no value)."""
    out = np.empty(len(draws))
    step = max(1, 4_000_000 // max(1, hist.shape[1]))  # resamples per chunk: bounded memory
    for s in range(0, len(draws), step):
        h = draws[s : s + step] @ hist
        cum = np.cumsum(h, axis=1)
        total = cum[:, -1]
        rank = np.maximum(1.0, np.ceil(q / 100 * total - 1e-9))
        b = (cum < rank[:, None] - 1e-9).sum(axis=1)
        out[s : s + step] = np.where(total > 0, lo * (1 + BIN_WIDTH) ** (b + 0.5), np.nan)
    return out


def block_count(n_pairs: int, spec: GateSpec) -> int:
    """The blocks ``n_pairs`` paired requests are cut into: ``spec.blocks``, fewer for a short
    run (at least 5 pairs a block)."""
    return max(1, min(spec.blocks, n_pairs // 5))


def draws_of(n_pairs: int, spec: GateSpec) -> tuple[np.ndarray, np.ndarray]:
    """(block of each pair, resample draws (resamples x blocks, how often each block was drawn)):
    ``spec.blocks`` blocks of consecutive pairs (fewer for a short run: at least 5 pairs each),
    drawn with replacement by a generator seeded with ``spec.seed``."""
    k = block_count(n_pairs, spec)
    blocks = np.minimum(np.arange(n_pairs) * k // max(1, n_pairs), k - 1)
    rng = np.random.default_rng(spec.seed)
    draws = rng.multinomial(k, np.full(k, 1.0 / k), size=spec.resamples).astype(np.float64)
    return blocks, draws


def _interval(changes: np.ndarray, confidence: float) -> tuple[float, float] | None:
    finite = changes[np.isfinite(changes)]
    if len(finite) < 0.9 * len(changes):
        return None
    a = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(finite, [a, 100 - a])
    return float(lo), float(hi)


def _latency(
    p: Paired, spec: MetricSpec, blocks: np.ndarray, draws: np.ndarray, gate: GateSpec, cache: dict
) -> MetricResult:
    q = float(spec.quantile or 50.0)
    if spec.column not in cache:  # (a column's samples serve each of its percentiles)
        cache[spec.column] = (_samples(p.base, spec), _samples(p.cand, spec))
    (vb, ib, wb), (vc, ic, wc) = cache[spec.column]
    qb, qc = _nearest_rank(vb, wb, q), _nearest_rank(vc, wc, q)
    if qb is None or qc is None:
        which = "either run" if qb is None and qc is None else ("the baseline" if qb is None else "the candidate")
        return MetricResult(spec, qb, qc, None, None, None, "not judged", f"no {spec.label.split(' p')[0]} in {which}")
    if qb <= 0:
        return MetricResult(spec, qb, qc, None, None, None, "not judged", "the baseline's value is 0")
    need = math.ceil(MIN_TAIL / (1 - q / 100) - 1e-9)
    have = int(min(wb.sum(), wc.sum()))
    if have < need:
        why = f"p{spec.quantile:g} needs {need} values in each run, {'the baseline' if wb.sum() <= wc.sum() else 'the candidate'} has {have}"
        return MetricResult(spec, qb, qc, 100.0 * (qc / qb - 1), None, None, "not judged", why)
    pos = np.concatenate([vb[vb > 0], vc[vc > 0]])
    lo = float(pos.min()) if len(pos) else 1e-3
    hi = float(max(vb.max(), vc.max(), lo))
    n_bins = int(math.log(hi / lo) / math.log1p(BIN_WIDTH)) + 2
    k = draws.shape[1]
    rb = _resampled_quantiles(_block_hist(vb, blocks[ib], wb, lo, n_bins, k), draws, q, lo)
    rc = _resampled_quantiles(_block_hist(vc, blocks[ic], wc, lo, n_bins, k), draws, q, lo)
    change = 100.0 * (qc / qb - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ci = _interval(100.0 * (rc / rb - 1), gate.confidence)
    out = _judged(spec, qb, qc, change, ci)
    if out.verdict == "regressed" and stall_prone(spec.quantile, spec.column):  # (persistence: gatestall)
        passing = transient(half_changes((vb, ib, wb), (vc, ic, wc), p.n, q), spec.min_effect, spec.direction)
        if passing:
            out.verdict, out.reason = "held", passing
    return out


def half_changes(
    base: tuple[np.ndarray, np.ndarray, np.ndarray],
    cand: tuple[np.ndarray, np.ndarray, np.ndarray],
    n_pairs: int,
    q: float,
) -> tuple[float | None, float | None]:
    """The relative change (percent) of the ``q``-th percentile in the first and in the second
    half of the ``n_pairs`` paired requests; each run's samples are (values, pair index, weight).
    None for a half where either run has no value."""
    out: list[float | None] = []
    for first in (True, False):
        qs = []
        for values, idx, weights in (base, cand):
            keep = (idx < n_pairs / 2) if first else (idx >= n_pairs / 2)
            qs.append(_nearest_rank(values[keep], weights[keep], q))
        b, c = qs
        out.append(None if b is None or c is None or b <= 0 else 100.0 * (c / b - 1))
    return out[0], out[1]


def guard(results: list[MetricResult], slowed: str | None) -> list[MetricResult]:
    """``results`` with each stall-prone metric (``gatestall.stall_prone``) that regressed made
    ``not judged`` when ``slowed`` says why a run's own client slowed it (``gatestall.client_late``)."""
    if not slowed:
        return results
    for r in results:
        if r.verdict == "regressed" and stall_prone(r.spec.quantile, r.spec.column):
            r.verdict, r.reason = "not judged", f"{slowed}, and its tails measure that; change {r.change:+.1f}%"
    return results


def _share_counts(t: pa.Table, name: str, slos: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """Per pair: (1 when it counts against the share, 1 when it is judged): failures among the
    requests that succeeded or failed; or, for goodput, SLO met among those judged met or missed."""
    outcome = np.asarray(t.column("outcome").to_pylist(), dtype=object)
    if name == "error_rate":
        judged = np.isin(outcome, _JUDGED)
        return (outcome == "failed").astype(np.float64), judged.astype(np.float64)
    from replayer.results import verdict

    codes = verdict.judge(
        outcome, _f64(t, "ttft_ms"), _f64(t, "tpot_ms"), _f64(t, "e2e_ms"), _f64(t, "completion_tokens"), slos
    )["all"]
    judged = (codes == verdict.MET) | (codes == verdict.MISSED)
    return (codes == verdict.MET).astype(np.float64), judged.astype(np.float64)


def _share(
    p: Paired, spec: MetricSpec, blocks: np.ndarray, draws: np.ndarray, gate: GateSpec, slos: dict[str, float]
) -> MetricResult:
    if spec.name == "goodput" and not slos:
        return MetricResult(
            spec, None, None, None, None, None, "not judged", "no SLO: run with --goodput or set goodput in a gate file"
        )
    k = draws.shape[1]
    rates = []
    points = []
    for t in (p.base, p.cand):
        hit, judged = _share_counts(t, spec.name, slos)
        points.append(hit.sum() / judged.sum() if judged.sum() else None)
        h = np.bincount(blocks, weights=hit, minlength=k)
        j = np.bincount(blocks, weights=judged, minlength=k)
        with np.errstate(divide="ignore", invalid="ignore"):
            rates.append((draws @ h) / (draws @ j))
    b, c = points
    if b is None or c is None:
        return MetricResult(spec, b, c, None, None, None, "not judged", "no request judged in one of the runs")
    return _judged(spec, float(b), float(c), 100.0 * (c - b), _interval(100.0 * (rates[1] - rates[0]), gate.confidence))


def _judged(spec: MetricSpec, b: float, c: float, change: float, ci: tuple[float, float] | None) -> MetricResult:
    if ci is None:
        return MetricResult(spec, b, c, change, None, None, "not judged", "too few values for an interval")
    lo, hi = ci
    worse, better = (lo > spec.min_effect, hi < -spec.min_effect)
    if spec.direction == "higher":
        worse, better = (hi < -spec.min_effect, lo > spec.min_effect)
    verdict = "regressed" if worse else ("improved" if better else "held")
    return MetricResult(spec, b, c, change, lo, hi, verdict)


def judge(
    p: Paired, gate: GateSpec, slos: dict[str, float] | None = None, slowed: str | None = None
) -> list[MetricResult]:
    """Each of the gate's metrics judged over the paired runs (``slos``: the goodput bounds, ms;
    ``slowed``: why a run's own client slowed it, see ``guard``).
    Raises ``NotComparable`` when fewer than ``gate.min_requests`` pairs succeeded in both runs."""
    both = int((_success(p.base) & _success(p.cand)).sum())
    if both < gate.min_requests:
        raise NotComparable(
            f"too few requests: {both} of {p.n} paired requests succeeded in both runs, the gate needs "
            f"{gate.min_requests} (a longer slice, or min_requests in a gate file)"
        )
    blocks, draws = draws_of(p.n, gate)
    out = []
    cache: dict = {}
    for spec in gate.metrics:
        if spec.relative:
            out.append(_latency(p, spec, blocks, draws, gate, cache))
        else:
            out.append(_share(p, spec, blocks, draws, gate, slos or {}))
    return guard(out, slowed)


def overall(results: list[MetricResult]) -> str:
    """The gate's verdict: ``regressed`` when any metric regressed, else ``held``."""
    return "regressed" if any(r.verdict == "regressed" for r in results) else "held"
