"""Trace validation bounds (issue 47): a length beyond any served model (10M tokens by default,
``--max-trace-length``) is refused at start with file, row and field, not sent to fail per request."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replayer.trace import TraceError, open_trace
from replayer.trace.values import DEFAULT_LENGTH_BOUND, set_length_bound


def _rows(out_len: int) -> list[dict]:
    return [
        {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]},
        {"timestamp": 5, "input_length": 10, "output_length": out_len, "hash_ids": [2]},
    ]


def test_a_length_beyond_any_model_is_refused_with_file_row_and_field(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(10**12)))
    with pytest.raises(TraceError) as e:
        open_trace(path).validate()
    assert f"{path}: row 2: output_length: output_length 1000000000000 is beyond any served model" in str(e.value)
    assert f"more than {DEFAULT_LENGTH_BOUND} tokens (--max-trace-length raises the bound)" in str(e.value)
    pq.write_table(pa.Table.from_pylist(_rows(DEFAULT_LENGTH_BOUND + 1)), tmp_path / "t.parquet")
    with pytest.raises(TraceError, match="row 2: output_length: output_length 10000001 is beyond"):
        open_trace(tmp_path / "t.parquet").validate()
    pq.write_table(pa.Table.from_pylist(_rows(DEFAULT_LENGTH_BOUND)), tmp_path / "ok.parquet")
    open_trace(tmp_path / "ok.parquet").validate()  # (the bound itself is allowed)
    try:
        set_length_bound(10**13)
        open_trace(path).validate()
    finally:
        set_length_bound(DEFAULT_LENGTH_BOUND)


def test_the_bound_is_a_flag_of_run(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(5)))
    p = subprocess.run(
        [
            sys.executable, "-m", "replayer", "run", str(path), "--max-trace-length", "8",
            "--target", "http://127.0.0.1:9", "--results", str(tmp_path / "r"), "--admin-port", "0", "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert f"{path}: row 1: input_length: input_length 10 is beyond any served model: more than 8 tokens" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "r").exists()
