"""The fidelity verdict of a run whose results files retention removed: their figures kept in the
digest (``removed.json``'s ``fold.fidelity``) and merged with the files kept, so the verdict is of
the whole run (counts exact, the lag's p99 within the sketch's error, inter-arrivals exact on
their grid); the gap histograms against numpy on the gaps themselves; soaks against the embedded
simulator with retention, live and applied afterwards to a run that kept everything."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replayer.core import RequestResult
from replayer.core.result import to_table
from replayer.core.stats import RELATIVE_ACCURACY
from replayer.record import retention
from replayer.results.fidelity import FidelityBounds
from replayer.results.fidelitygaps import GapStream, gap_codes, gap_values, hist_ks, hist_of, hist_percentile
from replayer.results.removed import digest_file
from replayer.results.trend import ks_distance
from replayer.results.verdicts import verdict_sections

# -- the gap histograms, pure -------------------------------------------------------------------------


def test_quantiles_and_ks_from_histograms_are_those_of_the_gaps_on_the_grid():
    rng = np.random.default_rng(1)
    a = np.cumsum(np.rint(rng.exponential(40e6, 5_000)).astype(np.int64))  # (gaps of 40 ms on average)
    b = np.cumsum(np.rint(rng.exponential(45e6, 4_000) + rng.choice([0, 3e9], 4_000, p=[0.95, 0.05])).astype(np.int64))
    ha, hb = hist_of(a), hist_of(b)
    ga, gb = gap_values(gap_codes(np.diff(a))), gap_values(gap_codes(np.diff(b)))
    assert (gb > 1024).any()  # (gaps on the relative grid too)
    for q in (10, 50, 90, 99, 100):
        assert hist_percentile(ha, q) == pytest.approx(np.percentile(ga, q), abs=1e-9)
        assert hist_percentile(hb, q) == pytest.approx(np.percentile(gb, q), abs=1e-9)
    assert hist_ks(ha, hb) == pytest.approx(ks_distance(ga, gb), abs=1e-12)
    # the grid: 1 ms below 1,024 ms, 1 % steps above (a gap snapped up by at most 1 %)
    g = np.array([0.4, 0.6, 7.2, 1023.4, 1100.0, 30_000.0, 86_400_000.0]) * 1e6
    v = gap_values(gap_codes(g))
    assert list(v[:4]) == [0.0, 1.0, 7.0, 1023.0]
    assert np.all(v[4:] >= g[4:] / 1e6 - 1e-6) and np.all(v[4:] <= g[4:] / 1e6 * 1.01 + 1e-6)
    assert np.unique(gap_codes(np.geomspace(1, 86_400e9, 200_000))).size < 2_200  # (bounded: a day's gaps)


def test_a_stream_folded_file_by_file_has_the_gaps_of_the_whole_sequence():
    rng = np.random.default_rng(2)
    times = np.cumsum(rng.integers(0, 50_000_000, 3_000))
    order = np.argsort(times + rng.integers(0, 400_000_000, times.size))  # (recorded by their end: up to 0.4 s later)
    s = GapStream()
    for part in np.array_split(times[order], 5)[:4]:
        s.fold(part, int(part.max()) - 1_000_000_000)  # (watermark: 1 s before the last)
        s = GapStream(json.loads(json.dumps(s.to_json())))  # (through the digest's JSON)
    whole = s.finish(np.array_split(times[order], 5)[4])
    assert s.late == 0 and s.n == times.size
    ref = hist_of(np.sort(times))
    assert np.array_equal(whole[0], ref[0]) and np.array_equal(whole[1], ref[1])
    # a time below what was folded is left out and counted
    t = GapStream()
    t.fold(np.array([0, 10, 20, 30], dtype=np.int64), 25)
    t.finish(np.array([5, 40], dtype=np.int64))
    assert t.late == 1 and int(t.hist[1].sum()) == 4


# -- a folder written as a run writes it: results in end order, rolled in files -------------------------

CONFIG = json.dumps({"fidelity_max_lag_ms": 25.0, "drift_window_s": 1.0}).encode()


def _results(n: int, capped_until: int) -> list[RequestResult]:
    """A trace of a request every 20 ms; the first ``capped_until`` held back by a cap (500 ms
    waits: a stall), every 7th a session turn that waited 30 ms, every 50th lasting 3 s."""
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        due = i * 20_000_000
        queue = 500.0 if i < capped_until else 0.0
        session = 30.0 if i % 7 == 3 else 0.0
        lag = float(rng.exponential(0.05))  # (a sender's jitter, well under the 1 ms grid)
        sent = due + int((queue + session + lag) * 1e6)
        end = sent + (3_000_000_000 if i % 50 == 0 else int(rng.integers(50, 150) * 1e6))
        out.append(
            RequestResult(
                row=i,
                due_ns=due,
                sent_ns=sent,
                end_ns=end,
                outcome="success",
                dispatch_lag_ms=lag,
                queue_wait_ms=queue or None,
                session_wait_ms=session or None,
                input_length=16,
                prompt_len_sent=16,
                output_length=4,
                max_tokens=4,
            )
        )
    return out


def _write_folder(d, results: list[RequestResult], files: int, resumed_last: float = 0.0) -> None:
    """``results`` rolled into ``files`` files in the order they ended (the last one written by a
    run resumed ``resumed_last`` s later: its times are from its own anchor)."""
    d.mkdir()
    ordered = sorted(results, key=lambda r: r.end_ns)
    for k, part in enumerate(np.array_split(np.arange(len(ordered)), files)):
        rows = [ordered[i] for i in part]
        shift = int(resumed_last * 1e9) if k == files - 1 else 0
        for r in rows:
            r.due_ns, r.sent_ns, r.end_ns = r.due_ns - shift, r.sent_ns - shift, r.end_ns - shift
        wall = 1_700_000_000.0 + (resumed_last if k == files - 1 else 0.0)
        meta = {b"replayer.t0_wall_s": repr(wall).encode(), b"replayer.config": CONFIG}
        pq.write_table(to_table(rows).replace_schema_metadata(meta), d / f"requests-{k + 1:05d}.parquet")


def _fidelity(*dirs) -> dict:
    return verdict_sections([str(d) for d in dirs], {"scheduled": 2_000}, window_s=1.0)["fidelity"]


def _assert_same_figures(after: dict, before: dict) -> None:
    for key in ("rows", "sent", "unsent", "held_back", "lengths"):
        assert after[key] == before[key], key
    assert after["dispatch_lag_ms"]["max"] == before["dispatch_lag_ms"]["max"]
    assert after["dispatch_lag_ms"]["p99"] == pytest.approx(before["dispatch_lag_ms"]["p99"], rel=RELATIVE_ACCURACY)
    a, b = after["inter_arrival"], before["inter_arrival"]
    assert a["requests"] == b["requests"]
    for q in ("p10", "p50", "p90", "p99"):
        assert a[q] == pytest.approx(b[q], abs=1e-9), q
    assert a["ks_distance"] == pytest.approx(b["ks_distance"], abs=1e-12)
    assert a["ks_critical"] == pytest.approx(b["ks_critical"])


def test_a_stall_in_a_removed_file_is_still_judged_and_every_figure_is_the_whole_runs(tmp_path):
    # 2,000 requests in 5 files (the last one a resumed run's): the cap held the first 100 back
    # 500 ms each; retention removes the 4 oldest files, the stall with them
    res = tmp_path / "soak"
    _write_folder(res, _results(2_000, capped_until=100), files=5, resumed_last=30.0)
    before = _fidelity(res)
    assert before["verdict"] == "not_faithful" and "from_digest" not in before
    assert any(r.startswith("--max-concurrency held back 100 requests") for r in before["reasons"]), before["reasons"]
    kept_alone = tmp_path / "kept-alone"
    kept_alone.mkdir()
    gone = retention.apply(str(res), digest=digest_file, max_bytes=1)
    assert len(gone) == 4
    shutil.copy(res / "requests-00005.parquet", kept_alone)
    assert _fidelity(kept_alone)["verdict"] == "faithful"  # (the file kept alone: the stall is gone with its file)
    after = _fidelity(res)
    assert after["verdict"] == "not_faithful" and after["reasons"] == before["reasons"]
    _assert_same_figures(after, before)
    dig = after["from_digest"]
    assert dig["files"] == 4 and 0 < dig["requests"] < 2_000
    assert dig["inter_arrival"]["late"] == {"trace": 0, "achieved": 0} and not dig["inter_arrival"]["approximate"]
    assert dig["max_concurrency_bound_ms"] == 25.0
    assert any("4 results files retention removed" in n and "within 0.5%" in n for n in after["notes"]), after["notes"]
    removed = json.loads((res / "removed.json").read_text())["fold"]["fidelity"]
    assert removed["files"] == 4 and len(json.dumps(removed)) < 50_000  # (histograms and a few pending times)
    # a merge with another folder (no retention there): counts summed, each folder's own gaps
    other = tmp_path / "other"
    _write_folder(other, _results(2_000, capped_until=0), files=2)
    merged = _fidelity(res, other)
    assert merged["sent"] == 4_000 and merged["held_back"] == {
        **before["held_back"],
        "max_concurrency_share": 100 / 4_000,
        "sessions": 2 * before["held_back"]["sessions"],
        "sessions_share": before["held_back"]["sessions_share"],
    }
    assert merged["inter_arrival"]["requests"] == 4_000 and merged["from_digest"]["inter_arrival"]["per_folder"]
    assert merged["verdict"] == "not_faithful"


def test_a_faithful_run_with_retention_stays_faithful(tmp_path):
    res = tmp_path / "soak"
    _write_folder(res, _results(1_000, capped_until=0), files=4)
    before = _fidelity(res)
    retention.apply(str(res), digest=digest_file, max_bytes=1)
    after = _fidelity(res)
    assert before["verdict"] == after["verdict"] == "faithful", after["reasons"]
    _assert_same_figures(after, before)
    assert after["from_digest"]["files"] == 3
    # a digest an older replayer wrote (no fidelity figures): the files kept, and said
    removed = json.loads((res / "removed.json").read_text())
    del removed["fold"]["fidelity"]
    (res / "removed.json").write_text(json.dumps(removed))
    older = _fidelity(res)
    assert "from_digest" not in older and older["sent"] < before["sent"]
    assert any("kept no fidelity figures" in n for n in older["notes"]), older["notes"]


def test_a_request_in_flight_longer_than_the_digest_allowed_for_is_left_out_and_said(tmp_path):
    # requests of 100 ms, but one sent at 1 s lasting 25 s: recorded in the second file, after the
    # first file's times up to ~3 s were folded into the digest
    results = _results(2_000, capped_until=0)
    for r in results:
        r.end_ns = r.sent_ns + (25_000_000_000 if r.row == 50 else 100_000_000)
    res = tmp_path / "soak"
    _write_folder(res, results, files=3)
    before = _fidelity(res)
    assert len(retention.apply(str(res), digest=digest_file, max_bytes=1)) == 2
    after = _fidelity(res)
    for key in ("rows", "sent", "unsent", "held_back", "lengths"):
        assert after[key] == before[key], key
    ia = after["from_digest"]["inter_arrival"]
    assert ia["approximate"] and ia["late"] == {"trace": 1, "achieved": 1}
    assert after["inter_arrival"]["requests"] == before["inter_arrival"]["requests"] - 1
    assert after["inter_arrival"]["ks_distance"] == pytest.approx(before["inter_arrival"]["ks_distance"], abs=0.01)
    assert any("inter-arrivals approximate (1 due and 1 send times" in n for n in after["notes"]), after["notes"]


# -- end to end: soaks against the embedded simulator -------------------------------------------------


def _soak_trace(path) -> str:
    n = 40  # one second of trace at 40 requests a second, looped
    t = pa.table(
        {
            "timestamp": [i * 25 for i in range(n)],
            "input_length": [32] * n,
            "output_length": [4] * n,
            "hash_ids": [[2 * i, 2 * i + 1] for i in range(n)],
        }
    ).replace_schema_metadata({"replayer.block_size": "16", "replayer.time_unit": "ms"})
    pq.write_table(t, path)
    return str(path)


def _soak(tmp_path, name: str, *args: str) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [sys.executable, "-m", "replayer", "run", _soak_trace(tmp_path / "soak.parquet"), "--results"]
        + [str(tmp_path / name), "--admin-port", "0", "--quiet", "--no-scrape-target-metrics", "--loop", "6"]
        + ["--roll-rows", "60", "--flush-rows", "30", "--fidelity-max-lag-ms", "500", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_a_soak_with_retention_is_judged_as_the_same_soak_without(tmp_path):
    # the same run's folder judged whole, and after retention removed all but its newest file
    _soak(tmp_path, "whole")
    whole = json.loads((tmp_path / "whole" / "summary.json").read_text())["fidelity"]
    assert whole["sent"] == 6 * 40 and "from_digest" not in whole
    shutil.copytree(tmp_path / "whole", tmp_path / "retained")
    gone = retention.apply(str(tmp_path / "retained"), digest=digest_file, max_bytes=1)
    assert len(gone) >= 2
    summary = {"scheduled": whole["trace_rows_in_window"]}
    before = verdict_sections([str(tmp_path / "whole")], summary)["fidelity"]
    after = verdict_sections([str(tmp_path / "retained")], summary)["fidelity"]
    _assert_same_figures(after, before)
    assert after["verdict"] == before["verdict"] and after["from_digest"]["files"] == len(gone)
    # and live: a soak keeping as few bytes as it can is judged over every request it sent
    p = _soak(tmp_path, "live", "--retain-size", "1")
    live = json.loads((tmp_path / "live" / "summary.json").read_text())["fidelity"]
    removed = json.loads((tmp_path / "live" / "removed.json").read_text())
    assert len(removed["files"]) >= 2 and removed["fold"]["fidelity"]["files"] == len(removed["files"])
    assert live["sent"] == live["rows"] == 6 * 40 and live["inter_arrival"]["requests"] == 6 * 40
    assert live["from_digest"]["files"] == len(removed["files"])
    assert "results files retention removed" in p.stdout


def test_a_capped_burst_in_a_removed_file_is_still_judged_not_faithful(tmp_path):
    # 60 requests at once behind --max-concurrency 2 (most wait far beyond the lag bound), then
    # 100 a tenth of a second apart (the cap never reached); retention keeps only the newest file
    n_burst, n_sparse = 60, 100
    times = [0] * n_burst + [5_000 + 100 * i for i in range(n_sparse)]
    t = pa.table(
        {
            "timestamp": times,
            "input_length": [32] * len(times),
            "output_length": [4] * len(times),
            "hash_ids": [[2 * i, 2 * i + 1] for i in range(len(times))],
        }
    ).replace_schema_metadata({"replayer.block_size": "16", "replayer.time_unit": "ms"})
    pq.write_table(t, tmp_path / "burst.parquet")
    res = tmp_path / "capped"
    p = subprocess.run(
        [sys.executable, "-m", "replayer", "run", str(tmp_path / "burst.parquet"), "--results", str(res)]
        + ["--admin-port", "0", "--quiet", "--no-scrape-target-metrics", "--max-concurrency", "2"]
        + ["--fidelity-max-lag-ms", "500", "--roll-rows", "40", "--flush-rows", "20", "--retain-size", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    sec = json.loads((res / "summary.json").read_text())["fidelity"]
    assert sec["verdict"] == "not_faithful" and sec["sent"] == n_burst + n_sparse
    assert any(r.startswith("--max-concurrency 2 held back") for r in sec["reasons"]), sec["reasons"]
    assert sec["from_digest"]["files"] >= 2 and sec["held_back"]["max_concurrency_beyond_bound"] > 0
    # the files kept alone do not show the stall: without the digest it would have been faithful
    kept = tmp_path / "kept"
    kept.mkdir()
    for f in res.glob("requests-*.parquet"):
        shutil.copy(f, kept)
    alone = verdict_sections([str(kept)], {"scheduled": n_sparse}, bounds=FidelityBounds(max_lag_ms=500.0))
    assert alone["fidelity"]["held_back"]["max_concurrency_beyond_bound"] == 0, alone["fidelity"]["held_back"]
