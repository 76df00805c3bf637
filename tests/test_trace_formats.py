"""Formats and streaming: Azure CSV, generic JSONL/CSV with a mapping, string ids, Parquet shards,
``open_trace`` batches."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replayer.trace import (
    HASH_ID_KEY,
    SYNTH_ID_BASE,
    TraceError,
    TraceOrderWarning,
    hash_id_from_string,
    open_trace,
    parse_mapping,
    read_trace,
    slice_rows,
    write_parquet,
)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
MOONCAKE = SHARED / "mooncake_conversation.jsonl"
AZURE = SHARED / "azure_llm_inference_conv_2023.csv"
SLICE = REPO / "traces" / "mooncake_conversation_10min.parquet"
needs_azure = pytest.mark.skipif(not AZURE.exists(), reason="shared Azure trace not present")
needs_mooncake = pytest.mark.skipif(not MOONCAKE.exists(), reason="shared Mooncake trace not present")


def rows_of(t) -> list[tuple]:
    return [
        (int(t.timestamp_ns[i]), int(t.input_length[i]), int(t.output_length[i]), t.hash_ids(i).tolist())
        for i in range(len(t))
    ]


def problems(ei) -> set[tuple]:
    return {(p.file, p.row, p.field) for p in ei.value.problems}


# --------------------------------------------------------------------------------------------
# Azure


@needs_azure
def test_azure_csv_real_file():
    t = read_trace(AZURE)
    assert len(t) == 19_366 and t.metadata["format"] == "azure"
    with open(AZURE) as f:
        next(f)
        first = [next(f).strip().split(",") for _ in range(2)]
    assert first[0][0] == "2023-11-16 18:15:46.6805900" and first[1][0] == "2023-11-16 18:15:50.9951690"
    assert t.timestamp_ns[0] == 0 and t.timestamp_ns[1] == 4_314_579_000  # 100 ns digits kept
    assert t.input_length[:2].tolist() == [int(first[0][1]), int(first[1][1])]
    assert t.output_length[:2].tolist() == [int(first[0][2]), int(first[1][2])]
    assert (np.diff(t.timestamp_ns) >= 0).all()
    # no prefix information: every block unique, in the reserved range, ceil(len/512) per row
    lens = np.diff(t.hash_offsets)
    assert (lens == (t.input_length + 511) // 512).all()
    assert t.hash_values.min() >= SYNTH_ID_BASE and t.hash_values.max() < 2**63
    assert np.unique(t.hash_values).size == t.hash_values.size
    # deterministic: block k of the file (file order) is SYNTH_ID_BASE + k
    assert t.hash_ids(0)[0] == SYNTH_ID_BASE


def test_azure_like_csv_unsorted_and_bad_rows(tmp_path):
    p = tmp_path / "az.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:50.0000000,100,10\n"
        "2023-11-16 18:15:48.5000000,200,20\n"
        "2023-11-16 18:15:52.0000000,300,30\n"
    )
    with pytest.warns(TraceOrderWarning, match="1 rows out of"):
        t = read_trace(p)
    assert rows_of(t)[0][:3] == (0, 200, 20) and rows_of(t)[1][:3] == (1_500_000_000, 100, 10)
    assert t.source_row.tolist() == [3, 2, 4]  # CSV rows are line numbers (header = 1)
    q = tmp_path / "bad.csv"
    q.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:50.0000000,100,10\n"
        "yesterday,100,0\n"
        "2023-11-16 18:15:52.0000000,,5\n"
    )
    with pytest.raises(TraceError) as ei:
        read_trace(q)
    assert problems(ei) == {(str(q), 3, "timestamp"), (str(q), 3, "output_length"), (str(q), 4, "input_length")}
    assert f"{q}: row 3: timestamp: not a date-time" in str(ei.value)


# --------------------------------------------------------------------------------------------
# Generic JSONL / CSV with a mapping


def test_parse_mapping():
    assert parse_mapping("timestamp=ts, input_length=p") == {"timestamp": "ts", "input_length": "p"}
    assert parse_mapping("hash_ids=") == {"hash_ids": ""}
    for bad in ("stamp=ts", "timestamp", "input_length="):
        with pytest.raises(ValueError):
            parse_mapping(bad)


def test_generic_jsonl_mapping_seconds(tmp_path):
    p = tmp_path / "g.jsonl"
    p.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"t": 1.5, "in": 600, "out": 3, "blocks": [1, 2], "sid": 7},
                {"t": 0.25, "in": 10, "out": 4, "blocks": [1]},
            ]
        )
        + "\n"
    )
    m = "timestamp=t,input_length=in,output_length=out,hash_ids=blocks,session_id=sid"
    with pytest.warns(TraceOrderWarning):
        t = read_trace(p, mapping=m, time_unit="s")
    assert rows_of(t) == [(0, 10, 4, [1]), (1_250_000_000, 600, 3, [1, 2])]
    assert t.session_id == [None, "7"] and t.metadata["format"] == "jsonl"
    # no hash ids in the source: hash_ids= synthesises unique ones
    with pytest.warns(TraceOrderWarning):
        t2 = read_trace(p, mapping="timestamp=t,input_length=in,output_length=out,hash_ids=", time_unit="s")
    assert t2.hash_values.min() >= SYNTH_ID_BASE and np.unique(t2.hash_values).size == 3


def test_generic_csv_mapping_units_and_errors(tmp_path):
    p = tmp_path / "g.csv"
    p.write_text('when,prompt,gen,ids\n1000,600,3,"[5, 6]"\n1500,10,4,"[""0123456789abcdef"", ""x""]"\n')
    m = "timestamp=when,input_length=prompt,output_length=gen,hash_ids=ids"
    with pytest.raises(TraceError) as ei:  # second row: 2 ids for 10 tokens
        read_trace(p, mapping=m, time_unit="us")
    assert problems(ei) == {(str(p), 3, "hash_ids")}
    p.write_text('when,prompt,gen,ids\n1000,600,3,"[5, 6]"\n1500,10,4,"[""0123456789abcdef""]"\n')
    t = read_trace(p, mapping=m, time_unit="us")
    assert rows_of(t) == [(0, 600, 3, [5, 6]), (500_000, 10, 4, [0x0123456789ABCDEF])]
    with pytest.raises(TraceError) as ei:
        read_trace(p, mapping="timestamp=missing_col,input_length=prompt,output_length=gen,hash_ids=ids")
    assert problems(ei) == {(str(p), 0, "timestamp")} and "'missing_col'" in str(ei.value)
    with pytest.raises(TraceError) as ei:  # wrong value types name line and field
        q = tmp_path / "h.csv"
        q.write_text("timestamp,input_length,output_length,hash_ids\n0,abc,1,[0]\n1,5,1,[0]\n")
        read_trace(q)
    assert problems(ei) == {(str(q), 2, "input_length")}


# --------------------------------------------------------------------------------------------
# String ids (B16: 64 bits, same everywhere)


def test_string_hash_ids_map_to_64_bits(tmp_path):
    assert hash_id_from_string("ffffffffffffffff") == 2**64 - 1
    assert hash_id_from_string("00000000000000FF") == 255
    want = int.from_bytes(hashlib.blake2b(b"block-a", digest_size=8, key=HASH_ID_KEY).digest(), "big")
    assert hash_id_from_string("block-a") == want
    code = "from replayer.trace import hash_id_from_string as h; print(h('block-a'), h('sys/0'))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": s},
        ).stdout
        for s in ("1", "2")
    }
    assert outs == {f"{want} {hash_id_from_string('sys/0')}\n"}
    # two ids differing only above bit 32 stay different (the Dynamo u32 cut)
    a, b = "0000000100000001", "0000000200000001"
    p = tmp_path / "s.jsonl"
    p.write_text(
        "\n".join(
            json.dumps({"timestamp": i, "input_length": 600, "output_length": 1, "hash_ids": h})
            for i, h in enumerate([[a, "ffffffffffffffff"], [b, "block-a"], ["block-a", 3]])
        )
        + "\n"
    )
    t = read_trace(p)
    ids = [[int(x) & (2**64 - 1) for x in t.hash_ids(i)] for i in range(3)]
    assert ids == [[2**32 + 1, 2**64 - 1], [2**33 + 1, want], [want, 3]]
    out = tmp_path / "s.parquet"
    write_parquet(t, out)
    assert pq.read_schema(out).field("hash_ids").type.value_type == pa.uint64()
    assert rows_of(read_trace(out)) == rows_of(t)


# --------------------------------------------------------------------------------------------
# Parquet shards and streaming


def _shards(tmp_path, t, cuts) -> Path:
    d = tmp_path / "shards"
    d.mkdir()
    for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        write_parquet(slice_rows(t, a, b), d / f"part-{k:03d}.parquet")
    return d


def test_parquet_folder_and_glob_read_as_one(tmp_path):
    t = read_trace(SLICE)
    d = _shards(tmp_path, t, [0, 500, 501, 1200, len(t)])
    for src in (d, str(d / "part-*.parquet")):
        whole = read_trace(src)
        assert rows_of(whole) == rows_of(t)
        s = open_trace(src)
        assert s.num_rows == len(t) and s.block_size == 512
        got = list(s.batches(300))
        assert [b.row_offset for b in got] == list(np.cumsum([0] + [len(b) for b in got[:-1]]))
        assert max(len(b) for b in got) <= 300 and sum(len(b) for b in got) == len(t)
        assert np.concatenate([b.timestamp_ns for b in got]).tolist() == t.timestamp_ns.tolist()
        assert [h for b in got for h in rows_of(b)] == rows_of(t)
        s.validate()


def test_span_known_before_reading_rows(tmp_path):
    # the live view's progress and ETA need the trace time one loop spans, before the replay
    t = read_trace(SLICE)
    whole = int(t.timestamp_ns[-1] - t.timestamp_ns[0])
    d = _shards(tmp_path, t, [0, 500, len(t)])
    for src in (SLICE, d):  # Parquet, streamed: from row-group statistics
        assert open_trace(src).span_ns() == whole == 597 * 10**9
        assert open_trace(src).span_ns(100) is None  # a prefix would need its rows read
    jl = tmp_path / "t.jsonl"  # loaded whole: from its timestamps, also for a prefix
    jl.write_text(
        "".join(
            json.dumps({"timestamp": ts, "input_length": 10, "output_length": 5, "hash_ids": [i]}) + "\n"
            for i, ts in enumerate([40, 40, 90, 1040])
        )
    )
    s = open_trace(str(jl), fmt="mooncake")
    assert s.span_ns() == 1_000 * 10**6 and s.span_ns(3) == 50 * 10**6


def test_shard_problem_names_shard_file_and_row(tmp_path):
    t = read_trace(SLICE)
    d = _shards(tmp_path, t, [0, 100, 200])
    bad = d / "part-001.parquet"
    tbl = pq.read_table(bad)
    il = tbl.column("input_length").to_pylist()
    il[4] = 0
    pq.write_table(tbl.set_column(1, "input_length", pa.array(il, pa.int64())), bad)
    with pytest.raises(TraceError) as ei:
        read_trace(d)
    assert problems(ei) == {(str(bad), 5, "input_length")}
    with pytest.raises(TraceError) as ei:
        open_trace(d).validate()
    assert problems(ei) == {(str(bad), 5, "input_length")}


def test_stream_refuses_row_group_back_in_time(tmp_path):
    t = read_trace(SLICE)
    d = _shards(tmp_path, t, [0, 100, 200])
    os.rename(d / "part-000.parquet", d / "part-009.parquet")  # later shard now goes back in time
    with pytest.raises(TraceError, match="trace convert"):
        list(open_trace(d).batches(1000))
    with pytest.warns(TraceOrderWarning):  # the whole-trace reader sorts instead
        assert rows_of(read_trace(d)) == rows_of(t.head(200))


@needs_mooncake
def test_open_trace_jsonl_batches_equal_read_trace():
    t = read_trace(MOONCAKE)
    s = open_trace(MOONCAKE)
    got = list(s.batches(5000))
    assert [len(b) for b in got] == [5000, 5000, 2031] and got[2].row_offset == 10_000
    assert np.concatenate([b.timestamp_ns for b in got]).tolist() == t.timestamp_ns.tolist()
    assert got[1].hash_ids(0).tolist() == t.hash_ids(5000).tolist()


def test_b17_unsorted_jsonl_stream_keeps_pairs(tmp_path):
    p = tmp_path / "b17.jsonl"
    rows = [(5000, 100, 10, [1]), (2000, 200, 20, [2]), (8000, 300, 30, [3]), (2000, 400, 40, [4])]
    p.write_text(
        "\n".join(json.dumps(dict(zip(("timestamp", "input_length", "output_length", "hash_ids"), r))) for r in rows)
        + "\n"
    )
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = [r for b in open_trace(p).batches(3) for r in rows_of(b)]
    assert "2 rows out of timestamp order" in str(w[0].message)
    assert got == [(0, 200, 20, [2]), (0, 400, 40, [4]), (3_000_000_000, 100, 10, [1]), (6_000_000_000, 300, 30, [3])]
    with pytest.raises(TraceError) as ei:
        open_trace(p, strict=True)
    assert {(pr.row, pr.field) for pr in ei.value.problems} == {(2, "timestamp")}


def test_unsorted_within_one_row_group_sorted_there(tmp_path):
    p = tmp_path / "u.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": [10, 5, 20, 30],
                "input_length": [1, 2, 3, 4],
                "output_length": [1, 1, 1, 1],
                "hash_ids": [[0], [1], [2], [3]],
            }
        ),
        p,
        row_group_size=2,
    )
    with pytest.warns(TraceOrderWarning):
        got = [r for b in open_trace(p).batches(2) for r in rows_of(b)]
    assert [(r[0] // 1_000_000, r[1]) for r in got] == [(0, 2), (5, 1), (15, 3), (25, 4)]
