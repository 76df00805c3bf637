"""Results reach Parquet exactly as they were recorded, whatever the batching on the way."""

import dataclasses

import numpy as np

from replayer.core import RequestResult
from replayer.core.result import SCHEMA, Rows, batches_to_table
from replayer.record import Recorder, read_results


def _result(i: int, rng) -> RequestResult:
    ok = i % 7 != 3
    return RequestResult(
        row=i,
        loop=i % 2,
        input_length=100 + i,
        output_length=5,
        due_ns=i * 1_000,
        sent_ns=i * 1_000 + 7,
        outcome="success" if ok else "failed",
        error_kind="none" if ok else "http_status",
        http_status=200 if ok else 503,
        error=None if ok else f"HTTP 503 row {i}",
        prompt_tokens=100 + i if ok else None,
        completion_tokens=5 if ok else None,
        ttft_ms=float(rng.random()) if ok else None,
        session_id=f"s{i % 3}" if i % 2 else None,
        itl_ms=[float(x) for x in rng.random(int(rng.integers(0, 40)))] if ok else [],
    )


def _as_rows(results: list[RequestResult]) -> list[dict]:
    out = []
    for r in results:
        d = dataclasses.asdict(r)
        d["itl_ms"] = [float(np.float32(x)) for x in d["itl_ms"]]  # stored as float32
        d["itl_counts"] = None  # (the exact ITL form)
        out.append(d)
    return out


def test_rows_in_batches_equal_the_results_added():
    rng = np.random.default_rng(3)
    results = [_result(i, rng) for i in range(23)]
    rows = Rows(batch_rows=5)  # 4 full batches and a partial one
    for r in results:
        rows.add(r)
    assert rows.n == 23
    table = batches_to_table(rows.take())
    assert table.schema.equals(SCHEMA) and rows.n == 0 and rows.take() == []
    assert table.to_pylist() == _as_rows(results)


def test_recorder_parts_and_final_file_hold_every_result(tmp_path):
    rng = np.random.default_rng(4)
    results = [_result(i, rng) for i in range(300)]
    rec = Recorder(str(tmp_path / "r"), flush_rows=128)  # two flushes at 128, the rest at close
    for r in results:
        rec.add(r)
    rec.close()
    assert rec.rows_written == 300
    assert read_results(str(tmp_path / "r")).to_pylist() == _as_rows(results)


def test_a_roll_of_many_parts_is_written_in_bounded_row_groups(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    import replayer.record.recorder as recorder

    monkeypatch.setattr(recorder, "ROLL_GROUP_ROWS", 50)
    rng = np.random.default_rng(5)
    results = [_result(i, rng) for i in range(230)]
    rec = Recorder(str(tmp_path / "r"), flush_rows=20, metadata={"replayer.t0_wall_s": "1.5"})  # 12 parts
    for r in results:
        rec.add(r)
    rec.close()
    f = pq.ParquetFile(tmp_path / "r" / "requests.parquet")
    assert [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)] == [60, 60, 60, 50]
    assert f.schema_arrow.metadata[b"replayer.t0_wall_s"] == b"1.5"
    assert read_results(str(tmp_path / "r")).to_pylist() == _as_rows(results)
    assert not list((tmp_path / "r" / "parts").glob("*.parquet"))
