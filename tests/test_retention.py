"""Retention (``--retain-size``/``--retain-age``): the oldest rolled files go, the summary stays
whole (counts equal, statistics within the sketch's error), a removal cut short shows no result
twice, ``--resume`` does not send removed rows again; ``/status`` and ``/metrics`` report the
results folder's size and its oldest result."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import free_port

import replayer.record.retention as retention
from replayer.config import ConfigError, load_config
from replayer.core import RequestResult
from replayer.core.stats import RELATIVE_ACCURACY
from replayer.record import Recorder, read_results, result_files
from replayer.record.folder import rolled_files
from replayer.results import summarize_files
from replayer.results.foldjson import fold_to_json
from replayer.results.removed import digest_file

COUNTS = (
    "scheduled",
    "sent",
    "completed",
    "failed",
    "cancelled",
    "not_started",
    "total_input_tokens",
    "total_output_tokens",
    "ttft_ms_count",
    "itl_ms_count",
    "tpot_ms_count",
    "e2el_ms_count",
    "usage_missing",
    "prompt_token_mismatches",
    "completion_token_mismatches",
)
STATS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


def _run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "replayer", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def rolled_run(tmp_path, mooncake_slice, sim_process):
    """A finished replay of 20 s of the Mooncake trace rolled every 15 results: (folder, trace,
    common flags)."""
    trace = mooncake_slice(20)
    url, _ = sim_process("--itl-base-ms", "1", "--ttft-base-ms", "2")
    res = tmp_path / "r"
    common = ["--target", url, "--speedup", "20", "--admin-port", "0", "--quiet", "--no-scrape-target-metrics"]
    p = _run("run", str(trace), "--results", str(res), "--roll-rows", "15", "--flush-rows", "5", *common)
    assert p.returncode == 0, p.stderr[-2000:]
    assert len(rolled_files(str(res))) >= 4
    return res, trace, common


def _assert_same_summary(before: dict, after: dict) -> None:
    for k in COUNTS:
        assert after[k] == before[k], k
    assert after["duration"] == pytest.approx(before["duration"], rel=1e-9)
    for name in STATS:
        assert after[f"mean_{name}"] == pytest.approx(before[f"mean_{name}"], rel=1e-9)
        assert after[f"max_{name}"] == before[f"max_{name}"]
        for p in ("median", "p90", "p99"):
            b, a = before[f"{p}_{name}"], after[f"{p}_{name}"]
            assert abs(a - b) <= RELATIVE_ACCURACY * abs(b) + 1e-9, (name, p, a, b)


def test_removed_files_keep_the_summary_report_and_compare_whole(rolled_run, tmp_path, caplog):
    res, _, _ = rolled_run
    before = summarize_files(result_files(str(res)))
    fidelity = json.loads((res / "summary.json").read_text())["fidelity"]
    files = rolled_files(str(res))
    size = retention.folder_bytes(str(res))
    with caplog.at_level(logging.INFO, logger="replayer.record.retention"):
        gone = retention.apply(str(res), digest=digest_file, max_bytes=size - 1)  # just over: the oldest file goes
    assert gone == files[:1]
    assert "retention: removed" in caplog.text and files[0] in caplog.text
    gone += retention.apply(str(res), digest=digest_file, max_bytes=size // 3)
    assert 2 <= len(gone) < len(files) and rolled_files(str(res)) == files[len(gone) :]
    # within the bound, or down to the newest rolled file (never removed)
    assert retention.folder_bytes(str(res)) <= size // 3 or len(gone) == len(files) - 1
    after = summarize_files(result_files(str(res)))
    _assert_same_summary(before, after)
    assert read_results(str(res)).num_rows < before["scheduled"]  # the rows themselves are gone
    # the readers of a folder: compare's counts, report's summary, merge
    (res / "summary.json").unlink()
    p = _run("compare", str(res), str(res), "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    assert {r["key"]: r["a"] for r in json.loads(p.stdout)["rows"]}["completed"] == before["completed"]
    p = _run("merge", str(res), "-o", str(tmp_path / "merged"))
    merged = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert merged["completed"] == before["completed"] and merged["scheduled"] == before["scheduled"], p.stderr
    # and its fidelity verdict, of every request sent (the removed files' from their digest)
    fid = merged["fidelity"]
    assert fid["verdict"] == fidelity["verdict"] and fid["from_digest"]["files"] == len(gone)
    assert (fid["sent"], fid["held_back"], fid["inter_arrival"]["requests"]) == (
        fidelity["sent"],
        fidelity["held_back"],
        fidelity["inter_arrival"]["requests"],
    )


def test_a_removal_cut_short_shows_no_result_twice_and_the_next_writer_completes_it(rolled_run, tmp_path):
    res, _, _ = rolled_run
    before = summarize_files(result_files(str(res)))
    oldest = rolled_files(str(res))[0]
    keep = tmp_path / "copy.parquet"
    shutil.copy(oldest, keep)
    retention.remove(str(res), oldest, "test", digest_file)
    shutil.copy(keep, oldest)  # as if killed after removed.json was renamed, before the deletion
    assert oldest not in result_files(str(res))
    assert summarize_files(result_files(str(res)))["completed"] == before["completed"]
    Recorder(str(res)).close()  # the next writer in the folder (a resumed run)
    assert not (res / oldest.rsplit("/", 1)[1]).exists()
    assert summarize_files(result_files(str(res)))["completed"] == before["completed"]


def test_resume_after_removal_sends_no_removed_row_again(rolled_run):
    res, trace, common = rolled_run
    before = json.loads((res / "summary.json").read_text())
    retention.apply(str(res), digest=digest_file, max_bytes=retention.folder_bytes(str(res)) // 2)
    assert (res / retention.REMOVED).exists()
    p = _run("run", "--resume", str(res), str(trace), "--roll-rows", "15", *common)
    assert p.returncode == 0, p.stderr[-2000:]
    after = json.loads((res / "summary.json").read_text())
    for k in ("scheduled", "sent", "completed", "failed"):
        assert after[k] == before[k], k
    # the resumed run's fidelity verdict: the removed files' figures from their digest, as before
    fid, was = after["fidelity"], before["fidelity"]
    assert fid["from_digest"]["files"] >= 1 and fid["verdict"] == was["verdict"], fid["reasons"]
    assert (fid["sent"], fid["inter_arrival"]["requests"]) == (was["sent"], was["inter_arrival"]["requests"])
    assert fid["inter_arrival"]["ks_distance"] == pytest.approx(was["inter_arrival"]["ks_distance"], abs=1e-12)


def test_rolled_file_numbers_are_not_reused_after_a_removal(tmp_path):
    folder = str(tmp_path / "r")
    rec = Recorder(folder, flush_rows=10**6, roll_rows=2)
    for i in range(6):
        rec.add(RequestResult(row=i, outcome="success", sent_ns=i, end_ns=i + 1))
        rec.flush().result()
    names = [f.rsplit("/", 1)[1] for f in rolled_files(folder)]
    assert names == ["requests-00000.parquet", "requests-00001.parquet", "requests-00002.parquet"]
    retention.remove(folder, rolled_files(folder)[0], "test", digest_file)
    rec.close()
    assert [f.rsplit("/", 1)[1] for f in rolled_files(folder)] == names[1:]  # (nothing left to roll)
    rec = Recorder(folder, flush_rows=1)
    rec.add(RequestResult(row=6, outcome="success", sent_ns=6, end_ns=7))
    rec.close()
    assert rolled_files(folder)[-1].endswith("requests-00003.parquet")
    assert summarize_files(result_files(folder))["completed"] == 7


def test_age_bound_removes_files_whose_newest_result_is_older(rolled_run):
    res, _, _ = rolled_run
    files = rolled_files(str(res))
    ends = [retention.newest_end_s(f) for f in files]
    assert all(e is not None for e in ends) and ends == sorted(ends)
    now = ends[1] + 10.0
    gone = retention.apply(
        str(res), digest=digest_file, max_age_s=10.0 - 1e-3, now=now
    )  # the first two are older than 10 s
    assert gone == files[:2]


def test_status_and_metrics_report_the_results_folder(tmp_path, sim_process):
    trace = tmp_path / "short.parquet"  # short outputs: results end in the order they were sent
    p = _run(
        "trace",
        "synth",
        "-o",
        str(trace),
        "--rows",
        "1500",
        "--rate",
        "100",
        "--input-dist",
        "const:8",
        "--output-dist",
        "const:2",
        "--seed",
        "1",
    )
    assert p.returncode == 0, p.stderr[-2000:]
    url, _ = sim_process("--itl-base-ms", "1", "--ttft-base-ms", "1")
    port = free_port()
    res = tmp_path / "r"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace),
            "--results",
            str(res),
            "--target",
            url,
            "--speedup",
            "1",
            "--admin-port",
            str(port),
            "--quiet",
            "--no-scrape-target-metrics",
            "--flush-interval",
            "0.2",
            "--roll-interval",
            "2",
            "--retain-size",
            "60KB",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        status, seen = None, []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:
            # (looked at before /status is read: a status read after a removal has begun; the
            # status is as of the last flush, so only the later ones after it count)
            removed = (res / retention.REMOVED).exists()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as r:
                    status = json.loads(r.read())
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    metrics = r.read().decode()
            except OSError:
                time.sleep(0.2)
                continue
            if status["results_bytes"] is not None and status["results_oldest_timestamp_s"] is not None:
                seen.append((status, metrics, removed))
                if sum(r for *_, r in seen) > 3:
                    break
            time.sleep(0.2)
    finally:
        p.terminate()
        _, err = p.communicate(timeout=60)
    assert seen, err[-2000:]
    status, metrics, _ = seen[-1]
    assert 0 < status["results_bytes"] < 10**7
    assert abs(status["results_oldest_timestamp_s"] - time.time()) < 600
    assert f"replayer_results_bytes {float(status['results_bytes'])}" in metrics or "replayer_results_bytes " in metrics
    assert "replayer_results_oldest_timestamp_seconds " in metrics
    # retention moved the oldest result on: past the run's first send (its anchor), by at least
    # the removed files' span (each a 2 s roll)
    import pyarrow.parquet as pq

    t0 = float(pq.read_schema(result_files(str(res))[0]).metadata[b"replayer.t0_wall_s"])
    assert (res / retention.REMOVED).exists(), err[-2000:]
    assert status["results_oldest_timestamp_s"] > t0 + 1.0


def test_retention_settings_are_checked():
    assert retention.parse_bytes("2GB") == 2 * 10**9
    assert retention.parse_bytes("1.5GiB") == int(1.5 * 2**30)
    assert retention.parse_bytes("500M") == 500 * 10**6
    assert retention.parse_bytes("123") == 123
    with pytest.raises(ValueError, match="not a size"):
        retention.parse_bytes("two gigs")
    trace = "traces/mooncake_conversation_10min.parquet"
    cfg = load_config({"trace": trace, "retain_size": "2GB", "roll_interval_s": 600})
    assert cfg.retain_bytes == 2 * 10**9
    with pytest.raises(ConfigError, match="roll"):
        load_config({"trace": trace, "retain_age_s": 3600})
    with pytest.raises(ConfigError, match="retain_size"):
        load_config({"trace": trace, "retain_size": "lots", "roll_interval_s": 600})


def test_the_digest_keeps_every_part_of_the_summary_state():
    """A field added to ``SummaryFold`` must be added to the digest too (else a removal loses it)."""
    from replayer.results.fold import SummaryFold

    assert set(fold_to_json(SummaryFold())) == set(vars(SummaryFold()))


def test_the_digest_keeps_the_highest_part_number_not_every_part_name(tmp_path):
    """A week-long soak flushes a part every few seconds: the digest must not list each one, yet a
    later writer must never reuse a removed file's part number (also from a digest of the older
    form, which listed every part's name)."""
    folder = tmp_path / "r"
    rec = Recorder(str(folder), flush_rows=10**6, roll_rows=2)
    for i in range(6):
        rec.add(RequestResult(row=i, outcome="success", sent_ns=i, end_ns=i + 1))
        rec.flush().result()
    for f in rolled_files(str(folder))[:2]:
        retention.remove(str(folder), f, "test", digest_file)
    rec.close()
    digest = json.loads((folder / retention.REMOVED).read_text())
    assert "parts" not in digest and digest["parts_max"] == 3  # parts 0-3 were in the two files
    legacy = tmp_path / "legacy"
    (legacy / "parts").mkdir(parents=True)
    (legacy / retention.REMOVED).write_text(
        json.dumps({"files": [], "parts": ["part-00000041.parquet", "part-00000007.parquet"]})
    )
    assert retention.read_removed(str(legacy)).parts_max == 41
    rec = Recorder(str(legacy), flush_rows=10**6)
    rec.add(RequestResult(row=0, outcome="success", sent_ns=0, end_ns=1))
    rec.flush().result()
    assert sorted(p.name for p in (legacy / "parts").glob("part-*.parquet")) == ["part-00000042.parquet"]
    rec.close()


def test_the_folder_stays_within_the_size_bound_between_flushes_and_during_rolls(tmp_path, monkeypatch):
    # retention runs after each flush; the next flush's part and the roll's copy of the parts
    # (written before they are removed) come before the next retention: it leaves room for them
    import replayer.record.recorder as recorder_mod

    peaks: list[int] = []
    real_apply = retention.apply

    def measured_apply(results_dir, **kw):  # the folder as the flush left it: its part written, rolled
        peaks.append(retention.folder_bytes(results_dir))
        return real_apply(results_dir, **kw)

    monkeypatch.setattr(recorder_mod.retention, "apply", measured_apply)
    monkeypatch.setattr(
        recorder_mod,
        "_roll_step",  # mid-roll: the rolled file written, its parts not yet removed
        lambda step: peaks.append(retention.folder_bytes(str(tmp_path))) if step == "written" else None,
    )
    bound = 250_000
    rec = Recorder(str(tmp_path), flush_rows=10**9, roll_rows=400, retain_bytes=bound, digest=digest_file)
    for i in range(8000):
        rec.add(RequestResult(row=i, outcome="success", itl_ms=[float(i % 7 + j) for j in range(40)]))
        if i % 100 == 99:
            rec.flush().result()
    rec.close()
    removed = retention.read_removed(str(tmp_path))
    assert removed is not None and removed.rows > 0  # the bound made retention remove files
    assert max(peaks[10:]) <= bound, (max(peaks[10:]), bound)  # (past the first files: nothing to remove yet)
    kept = read_results(str(tmp_path)).column("row").to_pylist()
    gone = [int(r) for rows in removed.recorded_rows().values() for r in rows]
    assert sorted(kept + gone) == list(range(8000))  # each row kept or folded into removed.json, once


def test_the_digest_keeps_each_runs_window_under_its_name_and_reads_the_older_key(tmp_path):
    """``removed.json`` holds each run's window (first send, last end) as ``run_windows``; a
    digest written before the name changed held them as ``spans`` and still counts."""
    folder = tmp_path / "r"
    rec = Recorder(str(folder), flush_rows=10**6, roll_rows=2)
    for i in range(4):
        rec.add(RequestResult(row=i, outcome="success", sent_ns=10 * i, end_ns=10 * i + 5))
        rec.flush().result()
    retention.remove(str(folder), rolled_files(str(folder))[0], "test", digest_file)
    rec.close()
    digest = json.loads((folder / retention.REMOVED).read_text())
    assert "spans" not in digest and list(digest["run_windows"].values()) == [[0, 15]]
    older = tmp_path / "older"
    older.mkdir()
    (older / retention.REMOVED).write_text(json.dumps({"files": [], "spans": {"1.5": [3, 9]}}))
    assert retention.read_removed(str(older)).run_windows == {"1.5": [3, 9]}
