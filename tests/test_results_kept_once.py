"""Results kept exactly once, whatever happens (issue 17): a kill at any step of a roll shows no
row twice (to readers, to ``--resume``, to the summary); a damaged results file is reported by
name while every intact one is still read (``read_results``, report, merge, compare,
``--resume``); whole files are replaced atomically; an empty shard leaves a mergeable folder."""

from __future__ import annotations

import json
import logging
import resource
import subprocess
import sys
from collections import Counter

import pyarrow.parquet as pq
import pytest
from conftest import SHORT_OUTPUT, replay_command

from replayer.core import RequestResult
from replayer.record import Recorder, read_results, result_files
from replayer.results import summarize_files

#: a recorder in a child process that dies (os._exit: no clean-up at all) at one roll step
RECORD_AND_DIE = """
import os, sys
import replayer.record.recorder as recorder
from replayer.core.result import RequestResult
folder, step, roll_rows, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
recorder._roll_step = lambda s: os._exit(137) if s == step else None
rec = recorder.Recorder(folder, flush_rows=10**6, roll_rows=roll_rows or None)
for i in range(n):
    rec.add(RequestResult(row=i, outcome="success", sent_ns=i, end_ns=i + 1))
    rec.flush().result()  # one part per row
rec.close()
"""

#: ``replayer CMD...`` in a process killed (os._exit) at one step of a results roll ("" = never)
CLI_DYING_AT = """
import os, sys
import replayer.record.recorder as recorder
step = sys.argv[1]
if step:
    recorder._roll_step = lambda s: os._exit(137) if s == step else None
from replayer.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _replayer(*args: str, die_at: str = "", timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLI_DYING_AT, die_at, *args], capture_output=True, text=True, timeout=timeout
    )


def _rows(folder) -> list[int]:
    return sorted(read_results(str(folder), columns=["row"]).column("row").to_pylist())


ROLL_STEPS = ("written", "renamed", "removed 1", "removed 2")


@pytest.mark.parametrize("step", ROLL_STEPS)
@pytest.mark.parametrize("roll", ("mid-run", "final"))
def test_a_kill_at_any_step_of_a_roll_shows_each_row_once_and_a_new_writer_completes_it(tmp_path, roll, step):
    folder = tmp_path / "r"
    n, roll_rows = (3, 3) if roll == "mid-run" else (4, 0)  # mid-run: parts 0-2 roll into requests-00000
    p = subprocess.run(
        [sys.executable, "-c", RECORD_AND_DIE, str(folder), step, str(roll_rows), str(n)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 137, p.stderr[-2000:]
    assert _rows(folder) == list(range(n))  # every row written before the kill, each once
    assert summarize_files(result_files(str(folder)))["completed"] == n
    # the next writer in the folder (a resumed run) adds rows; the folder still holds each once
    rec = Recorder(str(folder), flush_rows=1)
    for i in range(n, n + 2):
        rec.add(RequestResult(row=i, outcome="success", sent_ns=i, end_ns=i + 1))
    rec.close()
    assert _rows(folder) == list(range(n + 2))
    assert summarize_files(result_files(str(folder)))["completed"] == n + 2
    if step != "written":  # the parts a rolled file holds are gone (before it: a killed run's parts, kept)
        assert not list(folder.glob("parts/part-*.parquet"))


def test_run_killed_while_removing_its_parts_then_resumed_counts_each_row_once(tmp_path, mooncake_slice, sim_process):
    # the audit's case: --flush-rows 1, killed just after requests.parquet appeared
    trace = mooncake_slice(30, max_output=SHORT_OUTPUT)
    n = sum(1 for _ in open(trace))
    url, _ = sim_process("--itl-base-ms", "1")
    res = tmp_path / "r"
    common = [
        "--target",
        url,
        "--speedup",
        "30",
        "--admin-port",
        "0",
        "--quiet",
        "--flush-rows",
        "1",
        "--no-scrape-target-metrics",
    ]
    p = _replayer("run", str(trace), "--results", str(res), *common, die_at="removed 1")
    assert p.returncode == 137, p.stderr[-2000:]
    assert (res / "requests.parquet").exists() and len(list(res.glob("parts/part-*.parquet"))) == n - 1
    assert _rows(res) == list(range(n))
    p = _replayer("run", "--resume", str(res), str(trace), *common)
    assert p.returncode == 0, p.stderr[-2000:]
    assert _rows(res) == list(range(n))
    summary = json.loads((res / "summary.json").read_text())
    assert summary["completed"] == summary["scheduled"] == n


def _killed_run_with_a_damaged_part(tmp_path, mooncake_slice, url):
    """A run killed before its final roll (parts only), one of its parts cut in half.
    Returns (folder, trace, n, the damaged part, its rows)."""
    trace = mooncake_slice(30, max_output=SHORT_OUTPUT)
    n = sum(1 for _ in open(trace))
    res = tmp_path / "r"
    p = _replayer(
        "run",
        str(trace),
        "--results",
        str(res),
        "--target",
        url,
        "--speedup",
        "30",
        "--admin-port",
        "0",
        "--quiet",
        "--flush-rows",
        "5",
        "--no-scrape-target-metrics",
        die_at="written",
    )
    assert p.returncode == 137, p.stderr[-2000:]
    parts = sorted(res.glob("parts/part-*.parquet"))
    assert len(parts) >= 3 and not list(res.glob("requests*.parquet"))
    bad = parts[1]
    lost = pq.read_table(bad, columns=["row"]).column("row").to_pylist()
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    return res, trace, n, bad, lost


def test_a_damaged_part_is_named_and_every_other_file_is_read(tmp_path, mooncake_slice, sim_process, caplog):
    url, _ = sim_process("--itl-base-ms", "1")
    res, trace, n, bad, lost = _killed_run_with_a_damaged_part(tmp_path, mooncake_slice, url)
    kept = sorted(set(range(n)) - set(lost))

    with caplog.at_level(logging.WARNING, logger="replayer.record.recorder"):
        assert _rows(res) == kept
    assert str(bad) in caplog.text and "damaged" in caplog.text
    s = summarize_files(result_files(str(res)))
    assert s["completed"] == len(kept) and s["damaged_files"] == [str(bad)]

    p = _replayer("report", str(res), "-o", str(tmp_path / "report.html"))
    assert p.returncode == 0 and "Traceback" not in p.stderr and str(bad) in p.stderr, p.stderr[-2000:]
    assert (tmp_path / "report.html").stat().st_size > 0

    p = _replayer("compare", str(res), str(res), "--json")
    assert p.returncode == 0 and "Traceback" not in p.stderr and str(bad) in p.stderr, p.stderr[-2000:]
    assert {r["key"]: r["a"] for r in json.loads(p.stdout)["rows"]}["completed"] == len(kept)

    p = _replayer("merge", str(res), "-o", str(tmp_path / "merged"))  # exit 1: a killed run, not a whole one
    assert p.returncode == 1 and "Traceback" not in p.stderr and str(bad) in p.stderr, p.stderr[-2000:]
    merged = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert merged["completed"] == len(kept) and any(str(bad) in w for w in merged["merge_warnings"])

    # --resume sends the rows only the damaged part held; the readable files then hold each row once
    p = _replayer(
        "run",
        "--resume",
        str(res),
        str(trace),
        "--target",
        url,
        "--speedup",
        "30",
        "--admin-port",
        "0",
        "--quiet",
        "--flush-rows",
        "5",
        "--no-scrape-target-metrics",
    )
    assert p.returncode == 0 and str(bad) in p.stderr, p.stderr[-2000:]
    assert _rows(res) == list(range(n))
    summary = json.loads((res / "summary.json").read_text())
    assert summary["completed"] == n and summary["damaged_files"] == [str(bad)]
    assert bad.exists()  # kept as it is: nothing is deleted that might be recovered


def test_an_interrupted_json_write_leaves_the_old_file_whole(tmp_path):
    from replayer.record.recorder import write_json

    path = tmp_path / "summary.json"
    write_json(str(path), {"completed": 1})
    with pytest.raises(TypeError):
        write_json(str(path), {"completed": 2, "bad": object()})
    assert json.loads(path.read_text()) == {"completed": 1}
    # a process dying half-way through the write (no clean-up at all)
    code = (
        "import os, sys; from replayer.record.recorder import atomic_file\n"
        "with atomic_file(sys.argv[1]) as f:\n"
        "    f.write(b'{\"completed\": ')\n"
        "    f.flush()\n"
        "    os._exit(137)\n"
    )
    p = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 137, p.stderr
    assert json.loads(path.read_text()) == {"completed": 1}


def test_merge_and_run_replace_summary_json_whole(tmp_path, mooncake_slice, sim_process, monkeypatch):
    import replayer.results.merge as merge

    url, _ = sim_process("--itl-base-ms", "1")
    trace = mooncake_slice(10, max_output=SHORT_OUTPUT)
    res = tmp_path / "r"
    p = _replayer(
        "run",
        str(trace),
        "--results",
        str(res),
        "--target",
        url,
        "--speedup",
        "30",
        "--admin-port",
        "0",
        "--quiet",
        "--no-scrape-target-metrics",
    )
    assert p.returncode == 0, p.stderr[-2000:]
    first = json.loads((res / "summary.json").read_text())
    out = tmp_path / "merged"
    merge.merge_results([str(res)], str(out), quiet=True)
    merged = json.loads((out / "summary.json").read_text())
    # a failure while the new summary is written (here: a value JSON cannot encode, which stops
    # the encoder half-way as a kill would) leaves the previous file, whole
    real = merge.fold_files

    def broken(files, slos=None):
        fold, damaged = real(files, slos)
        result = fold.result
        fold.result = lambda: {**result(), "zz": object()}
        return fold, damaged

    monkeypatch.setattr(merge, "fold_files", broken)
    with pytest.raises(TypeError):
        merge.merge_results([str(res)], str(out), quiet=True)
    assert json.loads((out / "summary.json").read_text()) == merged
    # the same for the run's own summary.json (a resumed run rewrites it)
    code = (
        "import sys; import replayer.run.finish as d; real = d.summarize_files\n"
        "d.summarize_files = lambda files, **kw: {**real(files, **kw), 'zz': object()}\n"
        "from replayer.cli import main; sys.exit(main(sys.argv[1:]))\n"
    )
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "run",
            "--resume",
            str(res),
            str(trace),
            "--target",
            url,
            "--admin-port",
            "0",
            "--quiet",
            "--no-scrape-target-metrics",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode != 0 and "TypeError" in p.stderr, p.stderr[-2000:]
    assert json.loads((res / "summary.json").read_text()) == first


def test_a_target_metrics_roll_cut_before_removing_its_parts_shows_each_sample_once(tmp_path, monkeypatch):
    import replayer.observe.target_samples as tm

    rows = [
        {
            "time_s": float(i),
            "t_ns": i,
            "metric": "vllm:prompt_tokens_total",
            "labels": "{}",
            "kind": "counter",
            "value": float(i),
        }
        for i in range(6)
    ]
    files = tm.SampleFiles(str(tmp_path))
    files.write_part(rows[:2])
    files.write_part(rows[2:4])

    def killed(path):  # the process dies right after the rename of target_metrics.parquet
        raise KeyboardInterrupt

    monkeypatch.setattr(tm.os, "remove", killed)
    with pytest.raises(KeyboardInterrupt):
        files.roll()
    monkeypatch.undo()
    assert len(list(tmp_path.glob("parts/target_metrics-*.parquet"))) == 2
    assert tm.read_samples(str(tmp_path)).column("t_ns").to_pylist() == [0, 1, 2, 3]
    again = tm.SampleFiles(str(tmp_path))  # a resumed run: new parts, then its roll
    again.write_part(rows[4:])
    assert again.roll() == 6
    assert tm.read_samples(str(tmp_path)).column("t_ns").to_pylist() == [0, 1, 2, 3, 4, 5]
    assert not list(tmp_path.glob("parts/target_metrics-*.parquet"))


def test_more_shards_than_rows_every_shard_merges_into_each_row_once(tmp_path, mooncake_slice, sim_process):
    src = mooncake_slice(60)
    rows_n, shards = 4, 5  # one shard more than rows: the last owns none (rows go by number mod shards)
    trace = tmp_path / "four.jsonl"
    trace.write_text("".join(open(src).readlines()[:rows_n]))
    url, _ = sim_process("--itl-base-ms", "1")
    dirs = [tmp_path / f"s{i}" for i in range(shards)]
    errs: dict[int, str] = {}
    for first in range(0, shards, 3):  # 3 processes at a time on a 2-core machine
        procs = {
            i: subprocess.Popen(
                replay_command(trace, url, dirs[i], "--speedup", "50", "--shard", f"{i}/{shards}", model=None),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(first, min(first + 3, shards))
        }
        for i, p in procs.items():
            _, errs[i] = p.communicate(timeout=180)
            assert p.returncode == 0, errs[i][-2000:]
    last = shards - 1
    assert "no row of the trace" in errs[last] and f"shard {last}/{shards}" in errs[last]
    assert read_results(str(dirs[last])).num_rows == 0
    assert json.loads((dirs[last] / "summary.json").read_text())["scheduled"] == 0
    p = _replayer("merge", *map(str, dirs), "-o", str(tmp_path / "merged"))
    assert "Traceback" not in p.stderr and "no results files" not in p.stderr, p.stderr[-2000:]
    merged = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert merged["scheduled"] == merged["completed"] == rows_n and merged["duplicate_rows"] == 0
    assert merged["shards"] == [f"{i}/{shards}" for i in range(shards)]
    # the shards ran in turns (3 processes at a time), not at one --start-at: that warning is expected
    assert [w for w in merged["merge_warnings"] if "anchored" not in w] == []
    assert p.returncode == (1 if merged["merge_warnings"] else 0), p.stderr[-2000:]
    rows = Counter(r for d in dirs for r in read_results(str(d), columns=["row"]).column("row").to_pylist())
    assert sorted(rows) == list(range(rows_n)) and set(rows.values()) == {1}


def test_out_of_file_descriptors_no_result_is_lost(tmp_path, sim_process):
    # more requests in flight than the process may open files: connects fail (recorded, with the
    # limit named) and writing a part fails too; the results stay in memory until it works again
    trace = tmp_path / "burst.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": i * 2.5, "input_length": 8, "output_length": 2, "hash_ids": [i]}) + "\n"
            for i in range(800)
        )
    )
    url, _ = sim_process("--ttft-base-ms", "1000", "--itl-base-ms", "1", "--prefill-us-per-token", "0")
    res = tmp_path / "res"

    def limit():  # soft = hard: the run cannot raise it
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    p = subprocess.run(
        replay_command(trace, url, res, "--flush-interval", "0.5", model=None),
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=limit,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "open-file limit, ulimit -n 256" in p.stderr
    assert "cannot write results" in p.stderr and "works again" in p.stderr  # the write failed, then caught up
    t = pq.read_table(res / "requests.parquet")
    assert sorted(t.column("row").to_pylist()) == list(range(800))  # every row, once
    outcomes = Counter(t.column("outcome").to_pylist())
    assert outcomes["failed"] > 0 and outcomes["success"] > 0 and sum(outcomes.values()) == 800
    summary = json.loads((res / "summary.json").read_text())
    assert summary["completed"] + summary["failed"] == 800
