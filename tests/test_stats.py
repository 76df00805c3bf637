"""Statistics at any run length (issue 19, cases B30 and B32): exact count, sum, min, max and a
numerically stable variance; nearest-rank percentiles, exact or within the sketch's stated
relative error; shards merge their sketches (or values), never their percentiles."""

import math

import numpy as np
import pyarrow.parquet as pq
import pytest

import replayer.core.stats as stats
from replayer.core import RequestResult, Stat
from replayer.core.result import to_table
from replayer.core.stats import RELATIVE_ACCURACY
from replayer.results import summarize, summarize_files


@pytest.fixture(params=["exact", "sketch"])
def mode(request, monkeypatch):
    """Run a test with percentiles from the values, and again from the sketch alone."""
    monkeypatch.setattr(stats, "EXACT_LIMIT", 0 if request.param == "sketch" else 2_000_000)
    return request.param


def _nearest_rank(sorted_values: np.ndarray, p: float) -> float:
    return float(sorted_values[max(1, math.ceil(p / 100 * sorted_values.size)) - 1])


def _b30_feed(requests: int, scale: float = 1.0, offset: float = 0.0):
    """B30's feed: gap k (0-based, feed order) = 5 + (k mod 40) ms; 50 gaps a request."""
    for r in range(0, requests, 1000):  # folded 1,000 requests (50,000 gaps) at a time
        k = np.arange(r * 50, min(requests, r + 1000) * 50)
        yield (5 + k % 40) * scale + offset


def test_b30_exact_statistics_in_ms_and_near_1e12_ns(mode):
    s = Stat()
    for batch in _b30_feed(20_000):  # 1,000,000 gaps (the benchmark feeds B30's 10,000,000)
        s.add(batch)
    assert s.count == 1_000_000 and s.min == 5 and s.max == 44
    assert s.total == 24_500_000 and s.mean == 24.5
    assert s.std() == pytest.approx(11.5434, abs=5e-5)
    slack = 0 if mode == "exact" else 0.5  # B30: a sketch lands within 0.5 ms of its definition
    for p, want in ((50, 24), (90, 40), (99, 44)):
        assert abs(s.percentile(p) - want) <= slack, p
    assert s.exact == (mode == "exact")
    ns = Stat()  # the second pass: nanoseconds with 1e12 ns added (a one-pass variance gives 0)
    for batch in _b30_feed(20_000, scale=1e6, offset=1e12):
        ns.add(batch)
    assert ns.std() == pytest.approx(11_543_396, rel=1e-4)
    assert ns.mean == pytest.approx(1e12 + 24.5e6, rel=1e-15)


def test_b32_nearest_rank_and_shards_merged_from_values_not_percentiles(mode, tmp_path):
    a = Stat()
    a.add(np.array([10.0] * 19 + [1000.0]))
    slack = 0 if mode == "exact" else RELATIVE_ACCURACY
    for p, want in ((50, 10), (95, 10), (99, 1000)):
        assert a.percentile(p) == pytest.approx(want, rel=slack), p
    assert a.count == 20 and a.total / a.count == 59.5
    # case B through the summary: two shards' results files, merged
    files = []
    for name, e2e in (("x", [10, 10, 10, 10, 1000]), ("y", [20, 20, 20, 20, 20])):
        rs = [
            RequestResult(
                row=i,
                due_ns=0,
                sent_ns=0,
                end_ns=int(v * 1e6),
                outcome="success",
                e2e_ms=float(v),
                e2el_from_due_ms=float(v),
            )
            for i, v in enumerate(e2e)
        ]
        files.append(str(tmp_path / f"{name}.parquet"))
        pq.write_table(to_table(rs), files[-1])
    s = summarize_files(files)
    assert s["e2el_ms_count"] == 10 and s["mean_e2el_ms"] == 114
    for key, want in (("median_e2el_ms", 20), ("p90_e2el_ms", 20), ("p99_e2el_ms", 1000)):
        assert s[key] == pytest.approx(want, rel=slack), key  # not 15 / 510, the shards' averages
    assert "nearest rank" in s["percentile_method"]
    assert s["percentiles_sketched"] == ([] if mode == "exact" else ["e2el_ms", "e2el_from_due_ms"])


def test_sketch_percentiles_of_1m_values_against_numpy_and_merged_across_4_shards():
    rng = np.random.default_rng(19)
    values = np.concatenate([rng.lognormal(3, 1, 600_000), rng.exponential(400, 400_000)])
    rng.shuffle(values)
    exact = np.sort(values)
    whole = Stat()
    for chunk in np.array_split(values, 16):
        whole.add(chunk)
    shards = [Stat() for _ in range(4)]
    for i, chunk in enumerate(np.array_split(values, 4)):
        for part in np.array_split(chunk, 3):
            shards[i].add(part)
    merged = Stat()
    for sh in shards:
        merged.merge(sh)
    assert not whole.exact and not merged.exact  # 1M values: from the sketch
    for s in (whole, merged):
        assert s.count == values.size and s.min == exact[0] and s.max == exact[-1]
        assert s.total == pytest.approx(values.sum(), rel=1e-12)
        assert s.std() == pytest.approx(values.std(), rel=1e-9)
        for p in (1, 10, 25, 50, 75, 90, 95, 99, 99.9, 99.99, 100):
            want = _nearest_rank(exact, p)
            assert abs(s.percentile(p) - want) <= RELATIVE_ACCURACY * want * (1 + 1e-9), p
    for p in (50, 90, 99):  # merged sketches are the sketch of all the values: same buckets
        assert merged.percentile(p) == whole.percentile(p)


def test_sketch_buckets_numpy_batches_as_the_library_would(mode):
    """``Stat.add`` buckets in numpy with the sketch's mapping: every representative value it
    hands the sketch maps back to its own bucket, and negative values and zeros count."""
    s = Stat()
    mapping = s.sketch._mapping
    for k in range(-3000, 3000, 7):
        assert mapping.key(mapping.value(k)) == k
    v = np.array([-5.0, -1.0, 0.0, 0.0, 3.0, 10.0, np.nan])
    s.add(v)
    assert s.count == 6 and s.sketch.count == 6  # NaN is unknown: left out
    slack = 0 if mode == "exact" else RELATIVE_ACCURACY
    for p, want in ((10, -5), (30, -1), (50, 0), (70, 3), (100, 10)):
        assert s.percentile(p) == pytest.approx(want, rel=slack, abs=1e-12), p


def test_summary_percentiles_are_nearest_rank_and_empty_is_none():
    rs = [
        RequestResult(row=i, due_ns=0, sent_ns=0, end_ns=1, outcome="success", ttft_ms=float(v), e2e_ms=50.0)
        for i, v in enumerate((10, 20))
    ] + [RequestResult(row=2, outcome="failed", error_kind="connect")]
    s = summarize(to_table(rs))
    assert s["median_ttft_ms"] == 10 and s["p99_ttft_ms"] == 20 and s["mean_ttft_ms"] == 15
    assert s["tpot_ms_count"] == 0 and s["median_tpot_ms"] is None and s["std_tpot_ms"] is None
    assert s["percentiles_sketched"] == []
