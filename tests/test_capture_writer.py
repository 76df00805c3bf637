"""The capture's trace writer on the shared crash-safe roll protocol (``replayer.record.rolling``): rows
in, rolled trace files out (the last one sorted by arrival), and a kill at any step of a roll
shows each row once to the trace reader, as the results recorder's kill tests show for results."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replayer.capture.writer import CaptureWriter
from replayer.record.rolling import ROLLED_PARTS
from replayer.trace import trace_paths

META = {"replayer.block_size": "16", "replayer.time_unit": "ns"}


def _row(i: int, ts: int) -> dict:
    return {"timestamp": ts, "input_length": 10 + i, "output_length": 2, "hash_ids": [i], "outcome": "ok"}


def _read(folder) -> list[int]:
    files = trace_paths(str(folder))
    return [v for f in files for v in pq.read_table(f, columns=["input_length"]).column(0).to_pylist()]


def test_rows_roll_into_trace_files_and_the_last_is_sorted_by_arrival(tmp_path):
    w = CaptureWriter(str(tmp_path), META, roll_rows=4)
    order = [5, 3, 9, 1, 7, 2, 8]  # arrival times out of completion order
    for i, ts in enumerate(order):
        w.add(_row(i, ts))
        w.flush().result()
    w.close()
    files = sorted(p.name for p in tmp_path.glob("*.parquet"))
    assert files == ["trace-00000.parquet", "trace-00001.parquet"] and not (tmp_path / "parts").exists()
    first, last = (pq.read_table(tmp_path / f) for f in files)
    assert first.column("timestamp").to_pylist() == order[:4]  # a mid-run roll keeps completion order
    assert last.column("timestamp").to_pylist() == sorted(order[4:])
    meta = last.schema.metadata
    assert meta[b"replayer.capture"] == b"1" and meta[b"replayer.block_size"] == b"16"
    assert ROLLED_PARTS in meta and w.rows_written == 7
    assert sorted(_read(tmp_path)) == [10 + i for i in range(7)]


def test_rows_of_a_failed_write_are_kept_and_written_once_it_works_again(tmp_path, caplog):
    w = CaptureWriter(str(tmp_path), META)
    parts = tmp_path / "parts"
    parts.rmdir()
    parts.write_text("")  # parts/ is a file now: every part write fails (ENOTDIR), as on a full disk
    for i in range(3):
        w.add(_row(i, i))
        w.flush().result()
    assert w.rows_written == 0 and w._w.unwritten_rows == 3 and w._w.write_errors == 3
    assert sum("cannot write captured rows" in r.getMessage() for r in caplog.records) == 1  # once, not per flush
    parts.unlink()
    parts.mkdir()
    w.add(_row(3, 3))
    w.flush().result()
    assert w.rows_written == 4 and w._w.unwritten_rows == 0
    assert any("works again: the 4 kept in memory are on disk" in r.getMessage() for r in caplog.records)
    w.close()
    assert sorted(_read(tmp_path)) == [10, 11, 12, 13]


def test_rows_still_unwritten_at_the_end_are_tried_again_then_reported_lost(tmp_path, caplog):
    w = CaptureWriter(str(tmp_path), META)
    parts = tmp_path / "parts"
    parts.rmdir()
    parts.write_text("")
    w.add(_row(0, 0))
    w.flush().result()
    w._w.close(what="captured rows", retry_s=1.5)  # (30 s by default)
    assert w._w.write_errors >= 2  # tried again before giving up
    assert any("1 captured rows could not be written" in r.getMessage() for r in caplog.records)


def test_an_empty_capture_leaves_one_readable_empty_file(tmp_path):
    w = CaptureWriter(str(tmp_path), META)
    w.close()
    t = pq.read_table(tmp_path / "trace-00000.parquet")
    assert t.num_rows == 0 and t.schema.metadata[b"replayer.capture"] == b"1"


WRITE_AND_DIE = """
import os, sys
from replayer.capture.writer import CaptureWriter
out, step = sys.argv[1], sys.argv[2]
w = CaptureWriter(out, {"replayer.time_unit": "ns"}, roll_rows=2)
w._w._on_step = lambda s: os._exit(137) if s == step else None
for i in range(5):
    w.add({"timestamp": 100 - i, "input_length": 10 + i, "output_length": 2, "hash_ids": [i]})
    w.flush().result()  # one part per row
w.close()
"""


@pytest.mark.parametrize("step", ("written", "renamed", "removed 1", "removed 2"))
def test_a_kill_at_any_step_of_a_roll_shows_each_row_once(tmp_path, step):
    p = subprocess.run([sys.executable, "-c", WRITE_AND_DIE, str(tmp_path), step], capture_output=True, timeout=120)
    assert p.returncode == 137, p.stderr.decode()
    rows = _read(tmp_path)
    assert Counter(rows) == Counter([10, 11])  # the two rows written before the first roll, once each
    assert pa.concat_tables([pq.read_table(f) for f in trace_paths(str(tmp_path))]).num_rows == 2
