"""One statistic of many values, folded batch by batch in bounded memory and mergeable.

``Stat`` holds what a summary reports of a latency (or any) statistic: count, sum, min and max
exact; mean and population variance exact and numerically stable (each batch's mean and sum of
squared deviations, combined with Chan et al.'s pairwise update, so values near 1e12 keep their
digits: case B30); percentiles by **nearest rank** (the ``ceil(p/100 * n)``-th smallest value,
1-based: case B32's definition), exact from the values themselves while the statistic holds at
most ``EXACT_LIMIT`` of them, from a DDSketch beyond.

Why DDSketch (``ddsketch`` on PyPI, Datadog's reference implementation) rather than
HdrHistogram: its guarantee is a *relative* error (each percentile within ``RELATIVE_ACCURACY``
of the true value of its rank) for any positive, negative or zero float, with no range or unit to
choose beforehand (HdrHistogram needs integers in a range fixed up front and its quantile is the
top of a bucket); two sketches with the same accuracy merge exactly (bucket counts add), so
shards, workers and resumed runs merge sketches, never percentiles; its memory is a few thousand
buckets whatever the number of values. Its ``add`` is pure Python (one value at a time, ~1 us),
too slow for the hundreds of millions of ITL samples of a long run, so ``Stat.add`` buckets a
numpy batch with the sketch's own logarithmic mapping in numpy (one ``log`` per value) and hands
the sketch one weighted value per occupied bucket (the bucket's representative value, which the
mapping maps back to the same bucket: ``tests/test_stats.py`` checks it).

Memory: ``EXACT_LIMIT`` float64 values at most (2 MB), then the sketch alone (~2,000 buckets
across six orders of magnitude at 0.5 %)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from ddsketch import DDSketch

#: DDSketch relative accuracy: every sketched percentile is within 0.5 % of the exact value of
#: its rank (half the 1 % the summary promises, so float rounding at a bucket edge never matters)
RELATIVE_ACCURACY = 0.005
#: percentiles are exact (from the values) while a statistic holds at most this many values
EXACT_LIMIT = 250_000
#: the summary's statement of the definition (``percentile_method``)
PERCENTILE_METHOD = (
    f"nearest rank: the ceil(p/100*n)-th smallest value; exact up to {EXACT_LIMIT:,} values "
    f"of a statistic, beyond that from a DDSketch within {RELATIVE_ACCURACY:.1%} relative error"
)


def latency_fields(name: str, values: np.ndarray) -> dict[str, float | None]:
    """``mean_<name>_ms``, ``median_<name>_ms`` and ``p99_<name>_ms`` of ``values`` (ms; NaN =
    unknown, left out; None when none is known): a summary section's figures for one latency."""
    st = Stat()
    st.add(values)
    return {
        f"mean_{name}_ms": st.mean if st.count else None,
        f"median_{name}_ms": st.percentile(50),
        f"p99_{name}_ms": st.percentile(99),
    }


class Stat:
    """Count, sum, min, max, mean, variance and nearest-rank percentiles of the values added.

    ``add(values)`` takes a numpy batch (NaN = unknown, left out); ``merge(other)`` adds another
    ``Stat``'s values (as if they had been added here). Empty: every statistic is None."""

    __slots__ = ("count", "total", "min", "max", "mean", "m2", "sketch", "_values")

    def __init__(self, exact: bool = True) -> None:
        """``exact=False``: percentiles from the sketch from the first value (no values kept: for
        the many small statistics of a long run, such as the drift verdict's windows)."""
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the mean
        self.sketch = DDSketch(RELATIVE_ACCURACY)
        self._values: list[np.ndarray] | None = [] if exact else None  # None once past EXACT_LIMIT

    @property
    def exact(self) -> bool:
        """True while percentiles come from the values themselves (not the sketch)."""
        return self._values is not None

    def add(self, values: np.ndarray) -> None:
        v = np.asarray(values, dtype=np.float64)
        unknown = np.isnan(v)
        if unknown.any():
            v = v[~unknown]
        del unknown
        if not v.size:
            return
        mean = float(v.mean())
        dev = v - mean  # (one temporary at a time: a batch may hold millions of ITL samples)
        dev *= dev
        self._combine(v.size, float(v.sum()), float(v.min()), float(v.max()), mean, float(dev.sum()))
        del dev
        _sketch_add(self.sketch, v)
        if self._values is not None:
            self._values = self._values + [v] if self.count <= EXACT_LIMIT else None

    def merge(self, other: "Stat") -> None:
        if not other.count:
            return
        self._combine(other.count, other.total, other.min, other.max, other.mean, other.m2)
        self.sketch.merge(other.sketch)
        if self._values is not None:
            self._values = (
                self._values + other._values if other._values is not None and self.count <= EXACT_LIMIT else None  # noqa: SLF001
            )

    def _combine(self, n: int, total: float, lo: float, hi: float, mean: float, m2: float) -> None:
        """Chan et al.'s parallel update of (count, mean, m2) with a batch's own."""
        count = self.count + n
        delta = mean - self.mean
        self.m2 += m2 + delta * delta * self.count * n / count
        self.mean += delta * n / count
        self.count = count
        self.total += total
        self.min = min(self.min, lo)
        self.max = max(self.max, hi)

    def std(self) -> float | None:
        """Population standard deviation (None when empty)."""
        return math.sqrt(max(self.m2, 0.0) / self.count) if self.count else None

    def percentile(self, p: float) -> float | None:
        """Nearest-rank ``p``-th percentile (0 < p <= 100): exact or within ``RELATIVE_ACCURACY``."""
        if not self.count:
            return None
        rank = min(self.count, max(1, math.ceil(p / 100 * self.count - 1e-9)))  # 1-based
        if self._values is not None:
            v = np.concatenate(self._values) if len(self._values) > 1 else self._values[0]
            return float(np.partition(v, rank - 1)[rank - 1])
        # DDSketch's quantile q is the value of 0-based rank floor(q * (n - 1)) (its "lower"
        # rank): ask for rank - 0.5 so that float rounding cannot land one rank low
        q = min(1.0, (rank - 0.5) / (self.count - 1)) if self.count > 1 else 0.0
        qv = self.sketch.get_quantile_value(q)
        assert qv is not None and self.max is not None and self.min is not None  # count > 0
        return min(self.max, max(self.min, float(qv)))

    def cdf(self, points: int) -> tuple[np.ndarray, np.ndarray]:
        """(values, fraction of values <= each) at about ``points`` points, for a CDF plot:
        evenly spaced ranks of the values while exact, else at most 1,000 sketched percentiles
        (each one walks the sketch's buckets)."""
        if not self.count:
            return np.zeros(0), np.zeros(0)
        if self._values is not None:
            v = np.sort(np.concatenate(self._values))
            idx = np.linspace(0, v.size - 1, min(points, v.size)).astype(np.int64)
            return v[idx], (idx + 1) / v.size
        points = min(points, 1_000)
        fractions = np.linspace(1 / points, 1.0, points)
        return np.array([self.percentile(100 * f) for f in fractions]), fractions

    def summary(self, name: str, percentiles: tuple[int, ...]) -> dict[str, float | int | None]:
        """``{name}_count``, ``mean_/median_/std_{name}``, ``p{P}_{name}``, ``max_{name}`` (the
        summary's field names; None when empty)."""
        out: dict[str, float | int | None] = {f"{name}_count": self.count}
        out[f"mean_{name}"] = self.total / self.count if self.count else None
        out[f"median_{name}"] = self.percentile(50)
        out[f"std_{name}"] = self.std()
        out.update({f"p{p}_{name}": self.percentile(p) for p in percentiles})
        out[f"max_{name}"] = self.max if self.count else None
        return out


def _sketch_add(sketch: DDSketch, v: np.ndarray) -> None:
    """Add the values ``v`` to ``sketch``: bucketed in numpy with the sketch's mapping (key =
    ceil(log(|x|) / log(gamma))), then one weighted ``add`` per occupied bucket."""
    mapping = sketch._mapping  # noqa: SLF001 - the library exposes no public accessor for it
    tiny = mapping.min_possible
    log_gamma = math.log(mapping.gamma)
    positive = int((v > tiny).sum())
    negative = int((v < -tiny).sum())
    for sign, count in ((1.0, positive), (-1.0, negative)):
        if not count:
            continue
        x = v if count == v.size and sign > 0 else (v[v > tiny] if sign > 0 else -v[v < -tiny])
        x = np.log(x)  # (in place from here: one temporary the size of the batch)
        x /= log_gamma
        np.ceil(x, out=x)
        lo = int(x.min())
        x -= lo
        counts = np.bincount(x.astype(np.int64))
        del x
        for k in np.flatnonzero(counts):
            sketch.add(sign * mapping.value(int(k) + lo), float(counts[k]))
    zeros = v.size - positive - negative
    if zeros:
        sketch.add(0.0, float(zeros))


def stat_to_json(s: Stat) -> dict[str, Any]:
    """``s`` as a JSON-able dict that ``stat_from_json`` takes back: the exact count, sum, min,
    max, mean and m2, and the sketch's occupied buckets (``{"key": count}`` per sign, and the
    zeros). The exact values are not kept: percentiles of a ``Stat`` read back come from its
    sketch (within ``RELATIVE_ACCURACY``), the other statistics stay exact."""

    def store(st: Any) -> dict[str, float]:
        return {str(st.offset + i): c for i, c in enumerate(st.bins) if c}

    sk = s.sketch
    return {
        "count": s.count,
        "total": s.total,
        "min": s.min if s.count else None,
        "max": s.max if s.count else None,
        "mean": s.mean,
        "m2": s.m2,
        "positive": store(sk._store),  # noqa: SLF001
        "negative": store(sk._negative_store),  # noqa: SLF001
        "zeros": sk._zero_count,  # noqa: SLF001
    }  # noqa: SLF001


def stat_from_json(d: dict[str, Any]) -> Stat:
    """The ``Stat`` that ``stat_to_json`` wrote (sketched percentiles: see there)."""
    s = Stat()
    if not d.get("count"):
        return s
    s.count, s.total, s.mean, s.m2 = int(d["count"]), float(d["total"]), float(d["mean"]), float(d["m2"])
    s.min, s.max = float(d["min"]), float(d["max"])
    mapping = s.sketch._mapping  # noqa: SLF001
    for sign, name in ((1.0, "positive"), (-1.0, "negative")):
        for key, c in d.get(name, {}).items():
            s.sketch.add(sign * mapping.value(int(key)), float(c))
    if d.get("zeros"):
        s.sketch.add(0.0, float(d["zeros"]))
    s._values = None  # noqa: SLF001 - the values themselves are gone: percentiles from the sketch
    return s


def itl_bucket_values(v: np.ndarray) -> np.ndarray:
    """Each value replaced by the representative value of its bucket of a ``RELATIVE_ACCURACY``
    DDSketch (within that relative error of it, and in the same bucket); zero, negative and NaN
    values are returned as they are. For the compact ITL form (``result.compact_itl``)."""
    mapping = DDSketch(RELATIVE_ACCURACY)._mapping  # noqa: SLF001 - no public accessor
    out = np.array(v, dtype=np.float64, copy=True)
    pos = out > mapping.min_possible
    if pos.any():
        keys = np.ceil(np.log(out[pos]) / math.log(mapping.gamma)).astype(np.int64)
        uniq, inv = np.unique(keys, return_inverse=True)
        out[pos] = np.array([mapping.value(int(k)) for k in uniq])[inv]
    return out
