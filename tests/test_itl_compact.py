"""The compact ITL form (``--itl-format sketch``): per request, each occupied bucket of the
summary's DDSketch as one value and a count. Its ITL statistics are within the sketch's stated
error of the exact list's (the count exactly), and every reader takes either form."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import replay_against, simulator, write_slice

from replayer.cli import main as cli_main
from replayer.core import RequestResult, Stat
from replayer.core.result import compact_itl, itl_samples, to_table
from replayer.core.stats import RELATIVE_ACCURACY
from replayer.record import read_results, result_files
from replayer.results import summarize_files

ITL_FIELDS = ("mean_itl_ms", "median_itl_ms", "p90_itl_ms", "p99_itl_ms", "max_itl_ms")


def _within(a: float, b: float) -> bool:
    """``a`` within the sketch's relative error of ``b`` (plus float32 rounding of the values)."""
    return abs(a - b) <= (RELATIVE_ACCURACY + 1e-6) * abs(b) + 1e-9


def test_compact_form_keeps_every_gap_counted_and_each_within_the_error():
    rng = np.random.default_rng(7)
    lens = np.array([0, 1, 5, 300, 2, 40], dtype=np.int32)
    itl = rng.lognormal(3, 0.5, lens.sum()).astype(np.float32)
    itl[3] = 0.0  # a zero gap (two tokens in one read) is kept as it is
    values, counts, new_lens = compact_itl(itl, lens)
    assert counts.sum() == itl.size and new_lens.sum() == values.size and (new_lens <= lens).all()
    assert new_lens[3] < 300  # one value per occupied bucket, not per gap
    start = 0
    vstart = 0
    for n, m in zip(lens, new_lens):  # per request: the same gaps, each within the error of its value
        exact = np.sort(itl[start : start + n].astype(np.float64))
        approx = np.sort(np.repeat(values[vstart : vstart + m], counts[vstart : vstart + m]).astype(np.float64))
        assert exact.size == approx.size
        assert np.all(np.abs(approx - exact) <= (RELATIVE_ACCURACY + 1e-6) * exact + 1e-12)
        start += n
        vstart += m


def test_a_table_in_either_form_gives_the_same_itl_statistics_within_the_error():
    rng = np.random.default_rng(3)
    results = [
        RequestResult(row=i, outcome="success", itl_ms=rng.lognormal(2.5, 0.4, rng.integers(0, 200)).tolist())
        for i in range(500)
    ]
    exact, compact = to_table(results), to_table(results, itl_format="sketch")
    assert compact.column("itl_counts").null_count == 0 and exact.column("itl_counts").null_count == len(results)
    a, b = Stat(), Stat()
    a.add(itl_samples(exact))
    b.add(itl_samples(compact))
    assert a.count == b.count == sum(len(r.itl_ms) for r in results)
    for p in (1, 50, 90, 99, 99.9, 100):
        assert _within(b.percentile(p), a.percentile(p)), p
    assert _within(b.total / b.count, a.total / a.count)
    # the two forms in one table (folders of runs with different --itl-format)
    both = pa.concat_tables([exact.slice(0, 250), compact.slice(250)])
    assert itl_samples(both).size == a.count


@pytest.fixture(scope="module")
def exact_run(tmp_path_factory):
    """A replay with the exact ITL lists, and its simulator (both tests of the module read it)."""
    tmp = tmp_path_factory.mktemp("exact")
    trace = write_slice(tmp / "slice.jsonl", 10)
    with simulator(tmp, "--itl-base-ms", "2", "--itl-per-running-us", "300") as (url, _):
        res = tmp / "exact"
        p = replay_against(trace, url, res, "--speedup", "10", model=None)
        assert p.returncode == 0, p.stderr[-2000:]
        yield res, trace, url


def test_summary_of_the_same_run_in_compact_form_is_within_the_sketch_error(exact_run, tmp_path):
    res, _, _ = exact_run
    compact = tmp_path / "compact"
    compact.mkdir()
    for f in result_files(str(res)):  # the same results, their ITL lists written in the compact form
        t = pq.read_table(f)
        lists = t.column("itl_ms").combine_chunks()
        values, counts, lens = compact_itl(lists.values.to_numpy(zero_copy_only=False), pc_lengths(lists))
        offsets = pa.array(np.concatenate(([0], np.cumsum(lens))).astype(np.int32))
        t = t.set_column(
            t.schema.get_field_index("itl_ms"), "itl_ms", pa.ListArray.from_arrays(offsets, pa.array(values))
        )
        t = t.set_column(
            t.schema.get_field_index("itl_counts"), "itl_counts", pa.ListArray.from_arrays(offsets, pa.array(counts))
        )
        pq.write_table(t, compact / f.rsplit("/", 1)[1])
        assert len(t.column("itl_ms").combine_chunks().values) < len(lists.values)
    a, b = summarize_files(result_files(str(res))), summarize_files(result_files(str(compact)))
    assert a["itl_ms_count"] == b["itl_ms_count"] > 1000
    for k in ITL_FIELDS:
        assert _within(b[k], a[k]), (k, a[k], b[k])
    for k in ("completed", "mean_tpot_ms", "p99_ttft_ms", "mean_e2el_ms"):  # the rest: unchanged
        assert a[k] == b[k]


def pc_lengths(lists: pa.ListArray) -> np.ndarray:
    import pyarrow.compute as pc

    return pc.list_value_length(lists).to_numpy(zero_copy_only=False).astype(np.int32)


def test_a_run_in_compact_form_counts_the_same_gaps_and_every_reader_takes_it(exact_run, tmp_path, capsys):
    res, trace, url = exact_run
    sk = tmp_path / "sketch"
    p = replay_against(trace, url, sk, "--speedup", "10", "--itl-format", "sketch", model=None)
    assert p.returncode == 0, p.stderr[-2000:]
    t = read_results(str(sk), columns=["itl_ms", "itl_counts"])
    assert t.column("itl_counts").null_count == 0
    a, b = json.loads((res / "summary.json").read_text()), json.loads((sk / "summary.json").read_text())
    assert b["itl_ms_count"] == a["itl_ms_count"] > 1000  # one sample per token after the first, either way
    assert b["completed"] == a["completed"]
    assert (sk / "requests.parquet").stat().st_size < (res / "requests.parquet").stat().st_size
    # (the readers in this process: a subprocess would add only its start-up)
    assert cli_main(["report", str(sk), "-o", str(tmp_path / "report.html")]) == 0
    capsys.readouterr()
    assert cli_main(["compare", str(res), str(sk), "--json"]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["completed"]["a"] == rows["completed"]["b"]
