"""Tests for replayer.trace: loading, validation (B15, B17, B25), conversion and the committed slice."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from replayer.trace import (
    Trace,
    TraceError,
    TraceOrderWarning,
    TraceProblem,
    convert,
    read_trace,
    write_parquet,
)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
MOONCAKE = SHARED / "mooncake_conversation.jsonl"
SLICE = REPO / "traces" / "mooncake_conversation_10min.parquet"

needs_mooncake = pytest.mark.skipif(not MOONCAKE.exists(), reason="shared Mooncake trace not present")


def write_jsonl(path: Path, rows: list) -> Path:
    with open(path, "w") as f:
        for r in rows:
            f.write(r if isinstance(r, str) else json.dumps(r))
            f.write("\n")
    return path


def row(ts, il, ol, hids, **extra):
    return {"timestamp": ts, "input_length": il, "output_length": ol, "hash_ids": hids, **extra}


def ids(n, start=0):
    return list(range(start, start + n))


def rows_of(t: Trace) -> list[tuple]:
    return [
        (int(t.timestamp_ns[i]), int(t.input_length[i]), int(t.output_length[i]), t.hash_ids(i).tolist())
        for i in range(len(t))
    ]


def problems_of(excinfo) -> list[TraceProblem]:
    return excinfo.value.problems


def has_problem(excinfo, row: int, field: str, contains: str = "") -> bool:
    return any(p.row == row and p.field == field and contains in p.message for p in problems_of(excinfo))


# --------------------------------------------------------------------------------------------
# Real Mooncake trace


@needs_mooncake
def test_mooncake_full_read_correct():
    # (how long the read takes is a number bench/bench_hotpaths.py prints, not a test's bound)
    t = read_trace(MOONCAKE)
    raw = [orjson.loads(line) for line in MOONCAKE.read_bytes().splitlines() if line.strip()]
    assert len(t) == len(raw) == 12031
    assert t.rows_out_of_order == 0
    assert t.block_size == 512
    assert t.hash_offsets.shape == (len(t) + 1,)
    assert t.hash_values.shape[0] == sum(len(r["hash_ids"]) for r in raw)
    for i in (0, 1, 5000, len(raw) - 1):
        r = raw[i]
        assert int(t.timestamp_ns[i]) == r["timestamp"] * 1_000_000
        assert int(t.input_length[i]) == r["input_length"]
        assert int(t.output_length[i]) == r["output_length"]
        assert t.hash_ids(i).tolist() == r["hash_ids"]
        assert int(t.source_row[i]) == i + 1
    assert t.timestamp_ns.dtype == np.int64 and t.hash_values.dtype == np.int64
    assert not t.timestamp_ns.flags.writeable


@needs_mooncake
def test_jsonl_to_parquet_round_trip_identical(tmp_path):
    src = read_trace(MOONCAKE)
    out = tmp_path / "full.parquet"
    written = convert(MOONCAKE, out, license="Apache-2.0")
    back = read_trace(out)
    assert len(back) == len(src) == len(written)
    for name in ("timestamp_ns", "input_length", "output_length", "hash_offsets", "hash_values", "source_row"):
        assert np.array_equal(getattr(back, name), getattr(src, name)), name
    assert back.metadata["time_unit"] == "ms"
    assert back.metadata["license"] == "Apache-2.0"
    assert back.metadata["source"] == "converted from mooncake_conversation.jsonl"
    tbl = pq.read_table(out)
    assert tbl.schema.field("timestamp").type == pa.int64()
    assert tbl.schema.field("hash_ids").type.value_type == pa.int64()
    md = tbl.schema.metadata
    assert md[b"replayer.schema_version"] == b"1"
    assert md[b"replayer.block_size"] == b"512"
    assert pq.ParquetFile(out).metadata.row_group(0).column(0).compression == "ZSTD"


# --------------------------------------------------------------------------------------------
# Committed slice


@needs_mooncake
def test_committed_slice_matches_first_ten_minutes():
    t = read_trace(SLICE)
    assert 1700 <= len(t) <= 1800
    assert len(t) == 1750
    assert t.duration_ns < 600 * 1_000_000_000
    assert t.metadata["license"] == "Apache-2.0"
    assert "Mooncake FAST'25" in t.metadata["source"]
    assert "conversation_trace.jsonl" in t.metadata["source"]
    assert "first 600 s" in t.metadata["source"]
    assert t.metadata["time_unit"] == "ms"
    assert t.metadata["schema_version"] == "1"
    assert t.block_size == 512
    full = read_trace(MOONCAKE)
    n = len(t)
    assert full.timestamp_ns[n] >= 600 * 1_000_000_000  # the cut is exactly at 600 s
    for name in ("timestamp_ns", "input_length", "output_length", "hash_offsets"):
        assert np.array_equal(getattr(t, name), getattr(full, name)[: len(getattr(t, name))]), name
    assert np.array_equal(t.hash_values, full.hash_values[: t.hash_values.shape[0]])


@needs_mooncake
def test_the_slices_the_tests_write_are_the_shared_traces_lines_byte_for_byte(mooncake_slice):
    """conftest's mooncake_slice writes from the committed slice: the same bytes as the lines of
    ../shared's trace that it stood for."""
    for seconds in (20, 600):
        lines = [
            line
            for line in MOONCAKE.read_bytes().splitlines(keepends=True)
            if orjson.loads(line)["timestamp"] < seconds * 1000
        ]
        assert mooncake_slice(seconds, f"s{seconds}.jsonl").read_bytes() == b"".join(lines)


def test_committed_slice_present_and_readable():
    assert SLICE.exists()
    t = read_trace(SLICE)
    assert len(t) > 0 and t.metadata["license"] == "Apache-2.0"


# --------------------------------------------------------------------------------------------
# B15: hash_ids count must equal ceil(input_length / block_size)


def test_b15_partial_and_full_block_rows_valid_short_row_rejected(tmp_path):
    p = write_jsonl(
        tmp_path / "b15.jsonl",
        [
            row(0, 700, 8, [10, 11]),
            row(10, 1024, 8, [10, 11]),
            row(20, 20, 8, [12, 13]),
        ],
    )
    with pytest.raises(TraceError) as ei:
        read_trace(p)
    msg = str(ei.value)
    assert str(p) in msg and "row 3" in msg and "hash_ids" in msg
    assert len(problems_of(ei)) == 1  # rows 1 and 2 are valid
    prob = problems_of(ei)[0]
    assert (prob.file, prob.row, prob.field) == (str(p), 3, "hash_ids")
    assert "expected 1 hash id" in prob.message and "got 2" in prob.message
    assert str(prob).startswith(f"{p}: row 3: hash_ids: ")

    ok = write_jsonl(tmp_path / "b15ok.jsonl", [row(0, 700, 8, [10, 11]), row(10, 1024, 8, [10, 11])])
    t = read_trace(ok)
    assert rows_of(t) == [(0, 700, 8, [10, 11]), (10_000_000, 1024, 8, [10, 11])]


@pytest.mark.parametrize(
    "il,n_ids,valid",
    [
        (512, 1, True),
        (1024, 2, True),
        (1536, 3, True),  # exact multiples
        (513, 2, True),
        (1025, 3, True),
        (1, 1, True),  # one past a multiple
        (512, 2, False),
        (513, 1, False),  # exact multiple / one past, wrong count
        (20, 2, False),
        (100, 5, False),
        (2000, 1, False),  # well short / far too many / too few
        (5000, 0, False),
    ],
)
def test_b15_block_count_boundaries(tmp_path, il, n_ids, valid):
    p = write_jsonl(tmp_path / "t.jsonl", [row(0, 600, 1, [0, 1]), row(5, il, 4, ids(n_ids, 100))])
    if valid:
        t = read_trace(p)
        assert t.hash_ids(1).tolist() == ids(n_ids, 100)
    else:
        with pytest.raises(TraceError) as ei:
            read_trace(p)
        expected = math.ceil(il / 512)
        assert has_problem(ei, 2, "hash_ids", f"got {n_ids}")
        assert has_problem(ei, 2, "hash_ids", f"expected {expected} hash id")


def test_block_size_argument_and_metadata(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [row(0, 300, 1, [1, 2, 3])])
    with pytest.raises(TraceError):
        read_trace(p)
    t = read_trace(p, block_size=100)
    assert t.block_size == 100
    out = tmp_path / "t.parquet"
    write_parquet(t, out)
    assert read_trace(out).block_size == 100  # from replayer.block_size metadata
    with pytest.raises(TraceError) as ei:
        read_trace(out, block_size=512)  # explicit value overrides metadata
    assert has_problem(ei, 1, "hash_ids", "expected 1 hash id")


# --------------------------------------------------------------------------------------------
# B17: whole rows stable-sorted; offsets from the smallest timestamp


B17_ROWS = [
    row(5000, 100, 10, [1]),
    row(2000, 200, 20, [2]),
    row(8000, 300, 30, [3]),
    row(2000, 400, 40, [4]),
]


def test_b17_unsorted_rows_sorted_whole(tmp_path):
    p = write_jsonl(tmp_path / "b17.jsonl", B17_ROWS)
    with pytest.warns(TraceOrderWarning, match="2 rows out of timestamp order"):
        t = read_trace(p)
    ms = 1_000_000
    assert rows_of(t) == [
        (0 * ms, 200, 20, [2]),
        (0 * ms, 400, 40, [4]),
        (3000 * ms, 100, 10, [1]),
        (6000 * ms, 300, 30, [3]),
    ]
    assert t.rows_out_of_order == 2
    assert t.source_row.tolist() == [2, 4, 1, 3]
    # speedup 2 is a scheduler concern, but the offsets halve exactly
    assert (t.timestamp_ns // 2 // ms).tolist() == [0, 0, 1500, 3000]


def test_b17_strict_is_an_error(tmp_path):
    p = write_jsonl(tmp_path / "b17.jsonl", B17_ROWS)
    with pytest.raises(TraceError) as ei:
        read_trace(p, strict=True)
    assert has_problem(ei, 2, "timestamp", "2 rows out of timestamp order")


def test_b17_sorting_survives_parquet_and_optional_columns(tmp_path):
    rows = [dict(r, request_id=f"r{k}", extra_body={"k": k}) for k, r in enumerate(B17_ROWS, 1)]
    p = write_jsonl(tmp_path / "b17.jsonl", rows)
    with pytest.warns(TraceOrderWarning):
        t = read_trace(p)
    assert t.request_id == ["r2", "r4", "r1", "r3"]
    assert [json.loads(x) for x in t.extra_body] == [{"k": 2}, {"k": 4}, {"k": 1}, {"k": 3}]
    assert t.session_id is None and t.model is None and t.priority is None
    out = tmp_path / "b17.parquet"
    write_parquet(t, out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the written file is sorted
        back = read_trace(out)
    assert rows_of(back) == rows_of(t)
    assert back.request_id == t.request_id and back.extra_body == t.extra_body
    assert back.rows_out_of_order == 0


def test_first_timestamp_nonzero_and_duplicates(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [row(7000, 1, 1, [0]), row(7000, 2, 1, [1]), row(7250, 3, 1, [2])])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = read_trace(p)
    assert t.timestamp_ns.tolist() == [0, 0, 250_000_000]
    assert t.input_length.tolist() == [1, 2, 3]
    assert t.rows_out_of_order == 0


def test_shuffled_input_sorted_stably(tmp_path):
    rng = np.random.default_rng(7)
    ts = rng.integers(0, 50, size=300)
    rows = [row(int(x), k + 1, 1, ids(math.ceil((k + 1) / 512), k * 10)) for k, x in enumerate(ts)]
    p = write_jsonl(tmp_path / "t.jsonl", rows)
    with pytest.warns(TraceOrderWarning):
        t = read_trace(p)
    order = np.argsort(ts, kind="stable")
    assert t.input_length.tolist() == [rows[i]["input_length"] for i in order]
    for j, i in enumerate(order):
        assert t.hash_ids(j).tolist() == rows[i]["hash_ids"]
    assert t.timestamp_ns.tolist() == [(int(ts[i]) - int(ts.min())) * 1_000_000 for i in order]
    prev = np.maximum.accumulate(ts)
    assert t.rows_out_of_order == int((ts[1:] < prev[:-1]).sum())


# --------------------------------------------------------------------------------------------
# B25 and the other validation errors: each names file, row and field


@pytest.mark.parametrize(
    "bad,field,contains",
    [
        (row(0, 100, 0, [1]), "output_length", "output_length 0 is not allowed"),
        (row(0, 0, 5, []), "input_length", "input_length 0"),
        (row(0, -3, 5, []), "input_length", "-3"),
        (row(0, 100, -1, [1]), "output_length", "-1"),
        (row(0, "100", 5, [1]), "input_length", "got string"),
        (row(0, 100.5, 5, [1]), "input_length", "non-integer"),
        (row(0, 100, None, [1]), "output_length", "null"),
        (row(0, 100, True, [1]), "output_length", "boolean"),
        (row(-1, 100, 5, [1]), "timestamp", "negative timestamp"),
        (row(None, 100, 5, [1]), "timestamp", "null"),
        ({"input_length": 100, "output_length": 5, "hash_ids": [1]}, "timestamp", "missing"),
        ({"timestamp": 0, "output_length": 5, "hash_ids": [1]}, "input_length", "missing"),
        ({"timestamp": 0, "input_length": 100, "hash_ids": [1]}, "output_length", "missing"),
        ({"timestamp": 0, "input_length": 100, "output_length": 5}, "hash_ids", "missing"),
        (row(0, 100, 5, "1"), "hash_ids", "expected a list"),
        (row(0, 100, 5, 7), "hash_ids", "expected a list"),
        (row(0, 100, 5, [-4]), "hash_ids", "negative hash id -4"),
        (row(0, 100, 5, [""]), "hash_ids", "empty string"),
        (row(0, 100, 5, [None]), "hash_ids", "null"),
        (row(0, 100, 5, [1.5]), "hash_ids", "non-integer"),
        (row(0, 100, 5, [2**64]), "hash_ids", "int64"),
        (row(0, 100, 5, [1], extra_body="[1]"), "extra_body", "JSON object"),
        (row(0, 100, 5, [1], model=3), "model", "expected a string"),
        ('{"timestamp": 0, "input_length": 1', "json", "invalid JSON"),
        ("[1, 2]", "json", "expected a JSON object"),
    ],
)
def test_validation_errors_name_file_row_field(tmp_path, bad, field, contains):
    p = write_jsonl(tmp_path / "t.jsonl", [row(0, 10, 1, [0]), bad, row(5, 10, 1, [0])])
    with pytest.raises(TraceError) as ei:
        read_trace(p)
    assert has_problem(ei, 2, field, contains), str(ei.value)
    assert f"{p}: row 2: {field}: " in str(ei.value)
    assert all(pr.row == 2 for pr in problems_of(ei))  # good rows produce nothing


def test_b25_output_length_zero_rejected_one_accepted(tmp_path):
    p = write_jsonl(tmp_path / "b25.jsonl", [row(0, 100, 1, [0]), row(0, 100, 0, [1])])
    with pytest.raises(TraceError) as ei:
        read_trace(p)
    assert [(pr.row, pr.field) for pr in problems_of(ei)] == [(2, "output_length")]
    ok = write_jsonl(tmp_path / "ok.jsonl", [row(0, 100, 1, [0])])
    assert read_trace(ok).output_length.tolist() == [1]


def test_all_problems_listed_at_once(tmp_path):
    p = write_jsonl(
        tmp_path / "t.jsonl",
        [
            row(0, 100, 0, [1]),  # row 1 output_length
            row(-5, 100, 5, [1]),  # row 2 timestamp
            "not json",  # row 3 json
            row(0, 20, 5, [1, 2]),  # row 4 hash_ids count
            row(0, "x", 5, [1]),  # row 5 input_length
        ],
    )
    with pytest.raises(TraceError) as ei:
        read_trace(p)
    got = [(pr.row, pr.field) for pr in problems_of(ei)]
    assert got == [(1, "output_length"), (2, "timestamp"), (3, "json"), (4, "hash_ids"), (5, "input_length")]
    lines = str(ei.value).splitlines()
    assert len(lines) == 5 and all(line.startswith(f"{p}: row ") for line in lines)


def test_problem_cap_with_more_count(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [row(0, 100, 0, [1]) for _ in range(120)])
    with pytest.raises(TraceError) as ei:
        read_trace(p)
    assert len(ei.value.problems) == 50 and ei.value.more == 70 and ei.value.total == 120
    assert str(ei.value).splitlines()[-1] == "... and 70 more problems"


def test_blank_lines_skipped_rows_are_line_numbers(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [row(0, 10, 1, [0]), "", "   ", row(0, 10, 0, [0])])
    with pytest.raises(TraceError) as ei:
        read_trace(p)
    assert has_problem(ei, 4, "output_length")


def test_json_array_file(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps([row(3, 10, 1, [0]), row(1, 10, 2, [1])]))
    with pytest.warns(TraceOrderWarning):
        t = read_trace(p)
    assert t.source_row.tolist() == [2, 1] and t.output_length.tolist() == [2, 1]


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.parquet"])
def test_empty_file(tmp_path, name):
    p = tmp_path / name
    if name.endswith(".jsonl"):
        p.write_text("\n\n")
    else:
        tbl = pa.table(
            {
                "timestamp": pa.array([], pa.int64()),
                "input_length": pa.array([], pa.int64()),
                "output_length": pa.array([], pa.int64()),
                "hash_ids": pa.array([], pa.list_(pa.int64())),
            }
        )
        pq.write_table(tbl, p)
    with pytest.raises(TraceError) as ei:
        read_trace(p)
    assert str(p) in str(ei.value) and "no rows" in str(ei.value)
    assert problems_of(ei)[0].field == "file"


def test_missing_file(tmp_path):
    for name in ("nope.jsonl", "nope.parquet"):
        with pytest.raises(TraceError) as ei:
            read_trace(tmp_path / name)
        assert problems_of(ei)[0].field == "file" and "no such file" in str(ei.value)
        assert str(tmp_path / name) in str(ei.value)


def test_corrupt_parquet(tmp_path):
    p = tmp_path / "x.parquet"
    p.write_bytes(b"this is not parquet at all \x00\x01\x02" * 10)
    with pytest.raises(TraceError) as ei:
        read_trace(p)
    assert str(p) in str(ei.value) and problems_of(ei)[0].field == "file"
    assert "Parquet" in str(ei.value)


def test_unknown_extension_and_format(tmp_path):
    p = tmp_path / "trace.xml"
    p.write_text("a,b\n")
    with pytest.raises(TraceError) as ei:
        read_trace(p)
    assert str(p) in str(ei.value) and problems_of(ei)[0].field == "format" and ".xml" in str(ei.value)
    with pytest.raises(TraceError):
        read_trace(p, fmt="xml")
    # an explicit format works whatever the extension
    q = write_jsonl(tmp_path / "trace.txt", [row(0, 10, 1, [0])])
    assert len(read_trace(q, fmt="mooncake")) == 1


def test_parquet_missing_column_and_wrong_types(tmp_path):
    p = tmp_path / "m.parquet"
    pq.write_table(pa.table({"timestamp": [0], "input_length": [10], "hash_ids": [[0]]}), p)
    with pytest.raises(TraceError) as ei:
        read_trace(p)
    assert [(pr.row, pr.field) for pr in problems_of(ei)] == [(0, "output_length")]
    assert f"{p}: output_length: missing required column" in str(ei.value)

    q = tmp_path / "w.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array([0, None, 2], pa.int64()),
                "input_length": ["10", "x", "10"],
                "output_length": pa.array([1.0, float("nan"), 0.0]),
                "hash_ids": pa.array([[0], [-1], None], pa.list_(pa.int64())),
            }
        ),
        q,
    )
    with pytest.raises(TraceError) as ei:
        read_trace(q)
    got = {(pr.row, pr.field) for pr in problems_of(ei)}
    assert got == {
        (1, "input_length"),
        (2, "timestamp"),
        (2, "input_length"),
        (2, "output_length"),
        (2, "hash_ids"),
        (3, "input_length"),
        (3, "output_length"),
        (3, "hash_ids"),
    }
    assert has_problem(ei, 2, "output_length", "NaN")
    assert has_problem(ei, 1, "input_length", "got string")
    assert has_problem(ei, 3, "output_length", "output_length 0 is not allowed")


def test_parquet_from_foreign_writer_defaults(tmp_path):
    """A plain pandas-written Parquet (no replayer metadata): ms, block 512, int32 and float columns ok."""
    import pandas as pd

    df = pd.DataFrame(
        {
            "timestamp": np.array([10, 20], dtype=np.int32),
            "input_length": [600.0, 10.0],
            "output_length": [3, 4],
            "hash_ids": [[5, 6], [7]],
            "session_id": ["a", None],
        }
    )
    p = tmp_path / "pd.parquet"
    df.to_parquet(p)
    t = read_trace(p)
    assert t.timestamp_ns.tolist() == [0, 10_000_000]
    assert t.input_length.tolist() == [600, 10] and t.block_size == 512
    assert t.metadata["time_unit"] == "ms"
    assert t.session_id == ["a", None]


def test_parquet_time_unit_metadata(tmp_path):
    tbl = pa.table(
        {"timestamp": [5, 7], "input_length": [1, 1], "output_length": [1, 1], "hash_ids": [[0], [1]]}
    ).replace_schema_metadata({"replayer.time_unit": "s"})
    p = tmp_path / "s.parquet"
    pq.write_table(tbl, p)
    assert read_trace(p).timestamp_ns.tolist() == [0, 2_000_000_000]
    pq.write_table(tbl.replace_schema_metadata({"replayer.time_unit": "minutes"}), p)
    with pytest.raises(TraceError) as ei:
        read_trace(p)
    assert problems_of(ei)[0].field == "metadata"


def test_write_parquet_refuses_unrepresentable_times(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [row(0, 1, 1, [0]), row(1, 1, 1, [0])])
    t = read_trace(p)
    with pytest.raises(ValueError, match="whole number"):
        write_parquet(t, tmp_path / "x.parquet", time_unit="s")
    write_parquet(t, tmp_path / "x.parquet", time_unit="us")
    assert read_trace(tmp_path / "x.parquet").timestamp_ns.tolist() == [0, 1_000_000]


def test_convert_first_seconds(tmp_path):
    p = write_jsonl(
        tmp_path / "t.jsonl", [row(1000, 1, 1, [0]), row(1999, 1, 1, [1]), row(2000, 1, 1, [2]), row(1500, 1, 1, [3])]
    )
    out = tmp_path / "o.parquet"
    with pytest.warns(TraceOrderWarning):
        t = convert(p, out, first_seconds=1.0, source="unit test", license="CC0")
    back = read_trace(out)
    assert back.timestamp_ns.tolist() == [0, 500_000_000, 999_000_000]
    assert [back.hash_ids(i).tolist() for i in range(3)] == [[0], [3], [1]]
    assert back.metadata["source"] == "unit test" and back.metadata["license"] == "CC0"
    assert len(t) == 3 and t.metadata["source"] == "unit test"
    with pytest.raises(ValueError):
        convert(p, out, first_seconds=0)
    with pytest.raises(TraceError):
        convert(write_jsonl(tmp_path / "bad.jsonl", [row(0, 1, 0, [0])]), tmp_path / "bad.parquet")
    assert not (tmp_path / "bad.parquet").exists()


# --------------------------------------------------------------------------------------------
# Property: random valid traces round-trip JSONL -> Parquet -> read unchanged


@st.composite
def valid_rows(draw):
    bs = draw(st.sampled_from([1, 16, 512]))
    n = draw(st.integers(1, 25))
    out = []
    for _ in range(n):
        il = draw(st.integers(1, 3000))
        k = -(-il // bs)
        hids = draw(st.lists(st.integers(0, 2**63 - 1), min_size=k, max_size=k))
        out.append(row(draw(st.integers(0, 10**9)), il, draw(st.integers(1, 5000)), hids))
    return bs, out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(valid_rows())
def test_property_round_trip(tmp_path, data):
    bs, rows = data
    src = tmp_path / "p.jsonl"
    write_jsonl(src, rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceOrderWarning)
        t = read_trace(src, block_size=bs)
        out = tmp_path / "p.parquet"
        convert(src, out, block_size=bs)
    back = read_trace(out)
    assert back.block_size == bs
    assert rows_of(back) == rows_of(t)
    ts = [r["timestamp"] for r in rows]
    order = sorted(range(len(rows)), key=lambda i: ts[i])  # Python's sort is stable
    expect = [
        ((ts[i] - min(ts)) * 1_000_000, rows[i]["input_length"], rows[i]["output_length"], rows[i]["hash_ids"])
        for i in order
    ]
    assert rows_of(t) == expect
    assert t.source_row.tolist() == [i + 1 for i in order]
