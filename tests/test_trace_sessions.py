"""Session and endpoint columns of traces (turn, parent_request_id, think_time_s, endpoint,
query_length, document_lengths, hash_ids_synthetic), ``trace sessionize`` and synth's ``turn``.

Every test writes real files to tmp_path and reads them back through the public API.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from replayer.cli import main as cli_main
from replayer.results.traceinspect import format_inspect, inspect_trace
from replayer.trace import (
    ENDPOINTS,
    Trace,
    TraceError,
    TraceOrderWarning,
    open_trace,
    parse_mapping,
    read_trace,
    trace_table,
    write_parquet,
)
from replayer.trace.synth import SynthSpec, synth, write_synth
from replayer.trace.tools import sessionize_trace

REPO = Path(__file__).resolve().parents[1]
SLICE = REPO / "traces" / "mooncake_conversation_10min.parquet"
NEW = ("turn", "parent_request_id", "think_time_s", "endpoint", "query_length", "document_lengths")


from test_trace import write_jsonl  # noqa: E402


def row(ts, il=10, ol=5, hids=None, **extra):
    return {
        "timestamp": ts,
        "input_length": il,
        "output_length": ol,
        "hash_ids": hids if hids is not None else [ts + 1000],
        **extra,
    }


def write_pq(path: Path, cols: dict, *, block_size: int = 512, row_group_size: int | None = None) -> Path:
    table = pa.table(cols).replace_schema_metadata({"replayer.block_size": str(block_size)})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def base_cols(n: int) -> dict:
    return {
        "timestamp": pa.array(range(n), pa.int64()),
        "input_length": pa.array([10] * n, pa.int64()),
        "output_length": pa.array([5] * n, pa.int64()),
        "hash_ids": pa.array([[1000 + i] for i in range(n)], pa.list_(pa.int64())),
    }


def problems(exc) -> list[tuple]:
    return [(Path(p.file).name, p.row, p.field, p.message) for p in exc.value.problems]


def has(exc, file: str, row_: int, field: str, contains: str = "") -> bool:
    return any(f == file and r == row_ and fl == field and contains in m for f, r, fl, m in problems(exc))


def think_list(t: Trace) -> list:
    return None if t.think_time_s is None else [None if math.isnan(x) else float(x) for x in t.think_time_s]


def columns(t: Trace) -> dict:
    return {
        "session_id": t.session_id,
        "request_id": t.request_id,
        "turn": t.turn,
        "parent_request_id": t.parent_request_id,
        "think_time_s": think_list(t),
        "endpoint": t.endpoint,
        "query_length": t.query_length,
        "document_lengths": t.document_lengths,
    }


# --------------------------------------------------------------------------------------------
# Parsing: JSONL (Mooncake auto format), Parquet, generic CSV with --map


GOOD = [
    row(0, 10, request_id="a", session_id="s", turn=0, think_time_s=0, endpoint="chat"),
    row(1, 10, request_id="b", session_id="s", turn=1, think_time_s=2.5, endpoint="/v1/chat/completions"),
    row(2, 10, request_id="c", endpoint="score", query_length=4, document_lengths=[3, 3]),
    row(3, 10, request_id="d", endpoint="rerank", query_length=2, document_lengths=[8]),
    row(4, 12, request_id="e", endpoint="embeddings", document_lengths=[5, 7]),
    row(5, 10, request_id="f", endpoint="completions", think_time_s=None),
]
GOOD_EXPECT = {
    "turn": [0, 1, None, None, None, None],
    "think_time_s": [0.0, 2.5, None, None, None, None],
    "endpoint": [
        "/v1/chat/completions",
        "/v1/chat/completions",
        "/v1/score",
        "/v1/rerank",
        "/v1/embeddings",
        "/v1/completions",
    ],
    "query_length": [None, None, 4, 2, None, None],
    "document_lengths": [None, None, [3, 3], [8], [5, 7], None],
    "parent_request_id": None,
}


def test_columns_parse_from_jsonl(tmp_path):
    t = read_trace(write_jsonl(tmp_path / "t.jsonl", GOOD))
    got = columns(t)
    for k, v in GOOD_EXPECT.items():
        assert got[k] == v, k
    assert t.think_time_s.dtype == np.float64 and not t.think_time_s.flags.writeable
    assert t.session_id == ["s", "s", None, None, None, None]
    assert t.hash_ids_synthetic is False


def test_columns_parse_from_parquet(tmp_path):
    n = 4
    cols = base_cols(n)
    cols["input_length"] = pa.array([10, 10, 10, 12], pa.int64())
    cols.update(
        request_id=pa.array(["a", "b", "c", "d"]),
        session_id=pa.array(["s", "s", None, None]),
        turn=pa.array([0, 3, None, None], pa.int32()),  # any integer width
        parent_request_id=pa.array([None, "a", None, None]),
        think_time_s=pa.array([1.25, None, float("nan"), 0.0], pa.float64()),
        endpoint=pa.array(["chat", None, "/v1/score", "embeddings"]),
        query_length=pa.array([None, None, 4, None], pa.int64()),
        document_lengths=pa.array([None, None, [2, 4], [12]], pa.list_(pa.int64())),
    )
    t = read_trace(write_pq(tmp_path / "t.parquet", cols))
    assert t.turn == [0, 3, None, None]
    assert t.parent_request_id == [None, "a", None, None]
    assert think_list(t) == [1.25, None, None, 0.0]  # null and NaN both mean "not set"
    assert t.endpoint == ["/v1/chat/completions", None, "/v1/score", "/v1/embeddings"]
    assert t.query_length == [None, None, 4, None]
    assert t.document_lengths == [None, None, [2, 4], [12]]
    # through open_trace too, in batches of one row
    batches = list(open_trace(tmp_path / "t.parquet").batches(1))
    assert [b.endpoint[0] for b in batches] == t.endpoint
    assert [b.document_lengths[0] for b in batches] == t.document_lengths
    assert [float(b.think_time_s[0]) for b in batches][0] == 1.25


def test_absent_columns_are_none(tmp_path):
    t = read_trace(write_jsonl(tmp_path / "t.jsonl", [row(0), row(1)]))
    for name in NEW:
        assert getattr(t, name) is None, name
    assert not t.hash_ids_synthetic


def test_generic_csv_with_mapping(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(
        "ts,il,ol,blocks,conv,k,think,api,q,docs,rid,parent\n"
        '0,10,5,"[1]",c1,0,0.5,chat,,,r1,\n'
        '1,10,5,"[2]",c1,1,,score,4,"[3, 3]",r2,r1\n'
        '2,10,5,"[3]",,,1,embeddings,,"[10]",r3,-1\n'
    )
    m = (
        "timestamp=ts,input_length=il,output_length=ol,hash_ids=blocks,session_id=conv,turn=k,"
        "think_time_s=think,endpoint=api,query_length=q,document_lengths=docs,request_id=rid,"
        "parent_request_id=parent"
    )
    t = read_trace(p, mapping=m)
    assert t.turn == [0, 1, None]
    assert think_list(t) == [0.5, None, 1.0]
    assert t.endpoint == ["/v1/chat/completions", "/v1/score", "/v1/embeddings"]
    assert t.query_length == [None, 4, None]
    assert t.document_lengths == [None, [3, 3], [10]]
    assert t.parent_request_id == [None, "r1", None]  # -1: no parent
    assert t.session_id == ["c1", "c1", "r3"]  # r3 has no parent: the root of its own chain


def test_csv_bad_cells_named(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text('ts,il,ol,blocks,k,think,docs\n0,10,5,"[1]",x,abc,"[0]"\n1,10,5,"[2]",1,2,nope\n')
    m = "timestamp=ts,input_length=il,output_length=ol,hash_ids=blocks,turn=k,think_time_s=think,document_lengths=docs"
    with pytest.raises(TraceError) as e:
        read_trace(p, mapping=m)
    assert has(e, "t.csv", 2, "turn", "expected an integer, got string 'x'")
    assert has(e, "t.csv", 2, "think_time_s", "expected a number")
    assert has(e, "t.csv", 2, "document_lengths", "document_lengths[0]: document_lengths 0 is not allowed")
    assert has(e, "t.csv", 3, "document_lengths", "expected a list of integers")


def test_parse_mapping_accepts_new_keys():
    m = parse_mapping("turn=t,parent_request_id=p,think_time_s=w,endpoint=e,query_length=q,document_lengths=d")
    assert m == {
        "turn": "t",
        "parent_request_id": "p",
        "think_time_s": "w",
        "endpoint": "e",
        "query_length": "q",
        "document_lengths": "d",
    }
    with pytest.raises(ValueError, match="document_lengths"):
        parse_mapping("bogus=x")  # the error lists the fields, new ones included


def test_endpoint_short_names_normalise(tmp_path):
    rows = [row(i, endpoint=name) for i, name in enumerate(ENDPOINTS)]
    rows += [row(10 + i, endpoint=path) for i, path in enumerate(ENDPOINTS.values())]
    for r in rows:
        if r["endpoint"] in ("score", "/v1/score", "rerank", "/v1/rerank"):
            r.update(query_length=2, document_lengths=[8])
    t = read_trace(write_jsonl(tmp_path / "t.jsonl", rows))
    assert t.endpoint == list(ENDPOINTS.values()) * 2
    assert ENDPOINTS == {
        "completions": "/v1/completions",
        "chat": "/v1/chat/completions",
        "embeddings": "/v1/embeddings",
        "score": "/v1/score",
        "rerank": "/v1/rerank",
    }


def test_think_time_nan_handling(tmp_path):
    # JSONL: null -> NaN; a missing key -> NaN; a column that never appears -> None
    t = read_trace(write_jsonl(tmp_path / "t.jsonl", [row(0, think_time_s=None), row(1), row(2, think_time_s=3)]))
    assert np.isnan(t.think_time_s[0]) and np.isnan(t.think_time_s[1]) and t.think_time_s[2] == 3.0
    # written as null, read back as NaN
    out = tmp_path / "t.parquet"
    write_parquet(t, out)
    col = pq.read_table(out).column("think_time_s")
    assert col.type == pa.float64() and col.null_count == 2
    back = read_trace(out)
    assert think_list(back) == [None, None, 3.0]
    # non-finite and negative values are errors; NaN in a Parquet float column means "not set"
    cols = base_cols(4)
    cols["think_time_s"] = pa.array([float("nan"), float("inf"), -0.5, 1.0])
    with pytest.raises(TraceError) as e:
        read_trace(write_pq(tmp_path / "bad.parquet", cols))
    assert [(r, f) for _, r, f, _ in problems(e)] == [(2, "think_time_s"), (3, "think_time_s")]
    assert has(e, "bad.parquet", 2, "think_time_s", "inf is not allowed: must be a finite number >= 0")


# --------------------------------------------------------------------------------------------
# Validation: every rule names file, 1-based row (JSONL: line) and field; all problems at once


def test_value_rules_name_file_row_field(tmp_path):
    rows = [
        row(0, turn=-1),
        row(1, turn=1.5),
        row(2, turn="3"),
        row(3, think_time_s=-1),
        row(4, think_time_s="soon"),
        row(5, endpoint="/v1/responses"),
        row(6, endpoint=3),
        row(7, query_length=0, document_lengths=[10]),
        row(8, document_lengths=[]),
        row(9, document_lengths=[5, 0, 5]),
        row(10, document_lengths=7),
        row(11, parent_request_id=[1]),
    ]
    with pytest.raises(TraceError) as e:
        read_trace(write_jsonl(tmp_path / "v.jsonl", rows))
    f = "v.jsonl"
    assert has(e, f, 1, "turn", "turn -1 is not allowed: must be >= 0")
    assert has(e, f, 2, "turn", "non-integer 1.5")
    assert has(e, f, 3, "turn", "expected an integer, got string")
    assert has(e, f, 4, "think_time_s", "-1.0 is not allowed")
    assert has(e, f, 5, "think_time_s", "expected a number (seconds), got string")
    assert has(
        e,
        f,
        6,
        "endpoint",
        "unknown endpoint '/v1/responses': expected one of /v1/completions, "
        "/v1/chat/completions, /v1/embeddings, /v1/score, /v1/rerank or the short "
        "names completions, chat, embeddings, score, rerank",
    )
    assert has(e, f, 7, "endpoint", "unknown endpoint 3")
    assert has(e, f, 8, "query_length", "query_length 0 is not allowed: must be >= 1")
    assert has(e, f, 9, "document_lengths", "empty list")
    assert has(e, f, 10, "document_lengths", "document_lengths[1]: document_lengths 0 is not allowed")
    assert has(e, f, 11, "document_lengths", "expected a list of integers, got int")
    assert has(e, f, 12, "parent_request_id", "expected a string, got list")
    assert e.value.total == 12  # one problem each: no follow-on errors from the cross-field rules
    assert "v.jsonl: row 6: endpoint: unknown endpoint" in str(e.value)


def test_document_rules(tmp_path):
    rows = [
        row(0, 10, query_length=4),  # query without documents
        row(1, 10, query_length=4, document_lengths=[3, 4]),  # 4 + 7 != 10
        row(2, 10, document_lengths=[3, 4]),  # 0 + 7 != 10
        row(3, 10, endpoint="score"),  # score needs both
        row(4, 10, endpoint="/v1/rerank", document_lengths=[10]),  # rerank needs query_length
        row(5, 10, endpoint="rerank", query_length=10),  # ... and document_lengths
        row(6, 10, endpoint="embeddings", document_lengths=[4, 6]),  # fine: a batch of inputs
        row(7, 10, endpoint="score", query_length=1, document_lengths=[9]),  # fine
    ]
    with pytest.raises(TraceError) as e:
        read_trace(write_jsonl(tmp_path / "d.jsonl", rows))
    f = "d.jsonl"
    assert has(e, f, 1, "document_lengths", "missing: required when query_length is set")
    assert has(
        e,
        f,
        2,
        "document_lengths",
        "query_length 4 + sum(document_lengths) 7 = 11 != input_length 10: they must be equal",
    )
    assert has(e, f, 3, "document_lengths", "query_length 0 + sum(document_lengths) 7 = 7 != input_length 10")
    assert has(e, f, 4, "query_length", "missing: endpoint /v1/score needs query_length and document_lengths")
    assert has(e, f, 4, "document_lengths", "missing: endpoint /v1/score needs")
    assert has(e, f, 5, "query_length", "missing: endpoint /v1/rerank needs")
    assert has(e, f, 6, "document_lengths", "missing: endpoint /v1/rerank needs")
    assert sorted({r for _, r, _, _ in problems(e)}) == [1, 2, 3, 4, 5, 6]
    assert e.value.total == 7


def test_document_rules_in_parquet_name_data_rows(tmp_path):
    cols = base_cols(3)
    cols["endpoint"] = pa.array(["score", "chat", "rerank"])
    cols["query_length"] = pa.array([4, None, None], pa.int64())
    cols["document_lengths"] = pa.array([[6], None, [10]], pa.list_(pa.int64()))
    with pytest.raises(TraceError) as e:
        read_trace(write_pq(tmp_path / "d.parquet", cols))
    assert problems(e) == [
        ("d.parquet", 3, "query_length", "missing: endpoint /v1/rerank needs query_length and document_lengths")
    ]


def test_turn_order_within_session(tmp_path):
    rows = [
        row(0, session_id="a", turn=0),
        row(10, session_id="a", turn=2),
        row(5, session_id="a", turn=1),  # sorted before line 2: fine
        row(20, session_id="a", turn=2),  # repeats turn 2: error
        row(30, session_id="b", turn=0),  # other session: independent
        row(40, turn=0),  # no session: not checked
        row(50, session_id="a", turn=1),  # goes back: error
        row(60, session_id="a"),  # no turn: not checked
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceOrderWarning)
        with pytest.raises(TraceError) as e:
            read_trace(write_jsonl(tmp_path / "o.jsonl", rows))
    assert problems(e) == [
        (
            "o.jsonl",
            4,
            "turn",
            "turn 2 of session 'a' does not follow turn 2 (row 2): turns of a session "
            "must strictly increase in time order",
        ),
        (
            "o.jsonl",
            7,
            "turn",
            "turn 1 of session 'a' does not follow turn 2 (row 4): turns of a session "
            "must strictly increase in time order",
        ),
    ]


def test_turn_order_checked_across_streaming_batches(tmp_path):
    cols = base_cols(5)
    cols["session_id"] = pa.array(["a", "b", "a", "b", "a"])
    cols["turn"] = pa.array([0, 0, 1, 1, 1], pa.int64())
    p = write_pq(tmp_path / "o.parquet", cols, row_group_size=2)
    with pytest.raises(TraceError) as e:
        open_trace(p).validate()
    assert problems(e) == [
        (
            "o.parquet",
            5,
            "turn",
            "turn 1 of session 'a' does not follow turn 1 (row 3): "
            "turns of a session must strictly increase in time order",
        )
    ]
    with pytest.raises(TraceError, match="row 5: turn"):
        read_trace(p)
    # batches() (lazy validation) checks turn order only within a batch: rows 3 and 5 are apart here
    assert [len(b) for b in open_trace(p).batches(2)] == [2, 2, 1]
    assert [len(b) for b in open_trace(p).batches(3)] == [3, 2]
    with pytest.raises(TraceError, match="row 5: turn"):
        list(open_trace(p).batches(5))  # rows 3 and 5 in one batch: caught when it is read


def test_turn_not_checked_for_chain_rows(tmp_path):
    # a chain may branch: two answers to turn 0 are both turn 1
    rows = [
        row(0, request_id="q", session_id="s", turn=0),
        row(1, request_id="a1", parent_request_id="q", session_id="s", turn=1),
        row(2, request_id="a2", parent_request_id="q", session_id="s", turn=1),
    ]
    t = read_trace(write_jsonl(tmp_path / "b.jsonl", rows))
    assert t.turn == [0, 1, 1]


# --------------------------------------------------------------------------------------------
# parent_request_id chains -> session_id


def test_parent_chains_across_streaming_batches(tmp_path):
    rid = ["a", "b", "c", "d", "e", "f", "g", None, "h"]
    parent = [None, "a", "b", "zz", "d", "c", "a", "g", None]
    sess = [None, None, None, None, None, None, "keep", None, None]
    n = len(rid)
    cols = base_cols(n)
    cols.update(request_id=pa.array(rid), parent_request_id=pa.array(parent), session_id=pa.array(sess))
    p = write_pq(tmp_path / "c.parquet", cols, row_group_size=2)
    expect = ["a", "a", "a", "zz", "zz", "a", "keep", "a", "h"]
    for max_rows in (1, 2, 3, 100):
        got = [s for b in open_trace(p).batches(max_rows) for s in b.session_id]
        assert got == expect, max_rows
    t = read_trace(p)
    assert t.session_id == expect
    assert t.parent_request_id == parent  # the original column is kept
    # JSONL (read whole, served in batches) gives the same
    rows = [row(i, request_id=rid[i], parent_request_id=parent[i], session_id=sess[i]) for i in range(n)]
    j = write_jsonl(tmp_path / "c.jsonl", rows)
    assert [s for b in open_trace(j).batches(2) for s in b.session_id] == expect


def test_parent_chains_follow_time_order_not_file_order(tmp_path):
    rows = [
        row(10, request_id="b", parent_request_id="a"),  # file line 1, but after a in time
        row(0, request_id="a"),
        row(20, request_id="x", parent_request_id="y"),  # y comes later: x's root is y itself
        row(30, request_id="y", parent_request_id="w"),  # ... and y's root is w (w is not in the trace)
        row(40, request_id="z", parent_request_id=-1),  # -1: no parent (Alibaba traces)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceOrderWarning)
        t = read_trace(write_jsonl(tmp_path / "p.jsonl", rows))
    assert t.request_id == ["a", "b", "x", "y", "z"]
    assert t.session_id == ["a", "a", "y", "w", "z"]
    assert t.parent_request_id == [None, "a", "y", "w", None]


# --------------------------------------------------------------------------------------------
# hash_ids_synthetic


def test_hash_ids_synthetic_flag_kept(tmp_path):
    p = write_jsonl(tmp_path / "g.jsonl", [{"ts": i, "il": 700, "ol": 3} for i in range(5)])
    t = read_trace(p, mapping="timestamp=ts,input_length=il,output_length=ol,hash_ids=")
    assert t.hash_ids_synthetic and t.head(2).hash_ids_synthetic
    assert all(
        b.hash_ids_synthetic
        for b in open_trace(p, mapping="timestamp=ts,input_length=il,output_length=ol,hash_ids=").batches(2)
    )
    out = tmp_path / "g.parquet"
    write_parquet(t, out)
    assert pq.read_schema(out).metadata[b"replayer.hash_ids"] == b"synthesised"
    back = read_trace(out)
    assert back.hash_ids_synthetic
    assert all(b.hash_ids_synthetic for b in open_trace(out).batches(2))
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,100,5\n")
    assert read_trace(azure).hash_ids_synthetic
    assert not read_trace(SLICE).hash_ids_synthetic
    with pytest.raises(ValueError, match="synthesised"):
        sessionize_trace(back)


# --------------------------------------------------------------------------------------------
# Round trip: read -> write_parquet / trace_table -> read


def test_round_trip_all_columns(tmp_path):
    rows = GOOD + [row(6, request_id="g", parent_request_id="a", turn=7)]
    t = read_trace(write_jsonl(tmp_path / "t.jsonl", rows))
    table = trace_table(t)
    assert table.schema.field("turn").type == pa.int64()
    assert table.schema.field("think_time_s").type == pa.float64()
    assert table.schema.field("document_lengths").type == pa.list_(pa.int64())
    out = tmp_path / "t.parquet"
    write_parquet(t, out)
    back = read_trace(out)
    assert columns(back) == columns(t)
    assert columns(back.head(3)) == {k: None if v is None else v[:3] for k, v in columns(t).items()}
    # columns that are absent stay absent
    plain = read_trace(write_jsonl(tmp_path / "p.jsonl", [row(0)]))
    write_parquet(plain, tmp_path / "p.parquet")
    assert not set(NEW) & set(pq.read_schema(tmp_path / "p.parquet").names)


@st.composite
def session_rows(draw):
    n = draw(st.integers(1, 20))
    names = list(ENDPOINTS) + list(ENDPOINTS.values())
    out = []
    for i in range(n):
        il = draw(st.integers(2, 3000))
        r = row(
            draw(st.integers(0, 50)),
            il,
            draw(st.integers(1, 50)),
            list(range(i * 10, i * 10 + -(-il // 512))),
            request_id=f"r{i}",
        )
        ep = draw(st.sampled_from([None, *names]))
        if ep is not None:
            r["endpoint"] = ep
        query = ep in ("score", "/v1/score", "rerank", "/v1/rerank")
        if query or draw(st.booleans()):
            q = draw(st.integers(1, il - 1)) if (query or draw(st.booleans())) else 0
            rest = il - q
            cuts = sorted(draw(st.sets(st.integers(1, rest - 1), max_size=min(3, rest - 1)))) if rest > 1 else []
            r["document_lengths"] = [b - a for a, b in zip([0, *cuts], [*cuts, rest])]
            if q:
                r["query_length"] = q
        if draw(st.booleans()):
            r["think_time_s"] = draw(st.one_of(st.none(), st.floats(0, 1e4, allow_nan=False)))
        if i and draw(st.booleans()):
            r["parent_request_id"] = draw(st.sampled_from([f"r{draw(st.integers(0, i - 1))}", "gone", -1]))
        s = draw(st.sampled_from([None, "a", "b"]))
        if s is not None:
            r["session_id"] = s
        out.append(r)
    # turns of each explicit session increase in (stable) time order
    seen: dict[str, int] = {}
    for i in sorted(range(n), key=lambda k: out[k]["timestamp"]):
        s = out[i].get("session_id")
        if s is not None:
            out[i]["turn"] = seen.get(s, -1) + draw(st.integers(1, 3))
            seen[s] = out[i]["turn"]
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(session_rows())
def test_property_round_trip_session_columns(tmp_path, rows):
    src = write_jsonl(tmp_path / "r.jsonl", rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceOrderWarning)
        t = read_trace(src)
    out = tmp_path / "r.parquet"
    write_parquet(t, out)
    back = read_trace(out)
    assert columns(back) == columns(t)
    streamed = [batch.session_id for batch in open_trace(out).batches(3)]
    assert (None if t.session_id is None else [x for b in streamed for x in b]) == t.session_id
    order = sorted(range(len(rows)), key=lambda k: rows[k]["timestamp"])
    assert t.endpoint is None or t.endpoint == [
        None if "endpoint" not in rows[k] else ENDPOINTS.get(rows[k]["endpoint"], rows[k]["endpoint"]) for k in order
    ]
    assert t.document_lengths is None or t.document_lengths == [rows[k].get("document_lengths") for k in order]


# --------------------------------------------------------------------------------------------
# inspect


def test_inspect_reports_sessions_endpoints_documents(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", GOOD)
    s = inspect_trace(p, max_rows=2)
    assert s["sessions"] == 1 and s["multi_turn_sessions"] == 1 and s["max_turns"] == 2
    assert s["endpoints"] == {
        "/v1/chat/completions": 2,
        "/v1/completions": 1,
        "/v1/embeddings": 1,
        "/v1/rerank": 1,
        "/v1/score": 1,
    }
    assert s["rows_with_documents"] == 3 and s["documents"] == 5
    text = format_inspect(s)
    assert "sessions         1  (1 multi-turn, max 2 turns; 2 rows)" in text
    assert "endpoints        /v1/chat/completions 2  /v1/completions 1" in text
    assert "documents        3 rows, 5 documents" in text
    plain = inspect_trace(SLICE)
    assert plain["endpoints"] is None and plain["rows_with_documents"] is None and plain["max_turns"] is None
    assert "endpoints" not in format_inspect(plain)


# --------------------------------------------------------------------------------------------
# sessionize


def sessionize_rows() -> list[dict]:
    ids = [
        [1, 2, 3],  # 0: new s0
        [1, 2, 3, 4, 5],  # 1: follows 0 (full prefix [1, 2])            -> s0 turn 1
        [1, 2, 9],  # 2: 0 matches but is no longer s0's latest   -> s1
        [7, 8],  # 3: new                                      -> s2
        [1, 2, 3, 4, 5, 6],  # 4: 1 ([1..4]) and 2 ([1, 2]) match; 2 is more recent -> s1 turn 1
        [1, 2, 3, 4, 5, 6, 7],  # 5: follows 4                                -> s1 turn 2
        [7, 9],  # 6: follows 3 (full prefix [7])             -> s2 turn 1
        [5],  # 7: no full blocks to share                  -> s3
        [1, 2, 3, 4, 10],  # 8: 1 is still s0's latest, [1..4] matches  -> s0 turn 2
    ]
    return [row(ts * 100, 4 * len(h) - 1, 1, h) for ts, h in enumerate(ids)]


def test_sessionize_exact(tmp_path):
    rows = sessionize_rows()
    shuffled = [rows[i] for i in (3, 0, 8, 5, 1, 7, 2, 6, 4)]  # time order decides, not file order
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceOrderWarning)
        t = read_trace(write_jsonl(tmp_path / "s.jsonl", shuffled), block_size=4)
    out, summary = sessionize_trace(t)
    assert out.session_id == ["s0", "s0", "s1", "s2", "s1", "s1", "s2", "s3", "s0"]
    assert out.turn == [0, 1, 0, 0, 1, 2, 1, 0, 2]
    assert summary == {"rows": 9, "sessions": 4, "multi_turn_sessions": 3, "max_turns": 3}
    assert out.hash_values.tolist() == t.hash_values.tolist() and out.source_row.tolist() == t.source_row.tolist()
    out3, summary3 = sessionize_trace(t, min_shared_blocks=3)
    assert out3.session_id == ["s0", "s1", "s2", "s3", "s1", "s1", "s4", "s5", "s6"]
    assert out3.turn == [0, 0, 0, 0, 1, 2, 0, 0, 0]
    assert summary3 == {"rows": 9, "sessions": 7, "multi_turn_sessions": 1, "max_turns": 3}
    with pytest.raises(ValueError, match="min_shared_blocks"):
        sessionize_trace(t, min_shared_blocks=0)


def test_sessionize_cli_keeps_rows_and_columns(tmp_path, capsys):
    rows = sessionize_rows()
    for i, r in enumerate(rows):
        r.update(request_id=f"q{i}", model="m", think_time_s=0.5)
    src = write_jsonl(tmp_path / "s.jsonl", rows)
    out = tmp_path / "s.parquet"
    assert cli_main(["trace", "sessionize", str(src), "-o", str(out), "--block-size", "4"]) == 0
    assert "9 rows, 4 sessions (3 multi-turn, max 3 turns)" in capsys.readouterr().out
    back = read_trace(out)
    assert back.session_id == ["s0", "s0", "s1", "s2", "s1", "s1", "s2", "s3", "s0"]
    assert back.turn == [0, 1, 0, 0, 1, 2, 1, 0, 2]
    assert back.request_id == [f"q{i}" for i in range(9)] and back.model == ["m"] * 9
    assert think_list(back) == [0.5] * 9
    assert back.timestamp_ns.tolist() == [i * 100_000_000 for i in range(9)]
    assert "sessionized" in back.metadata["source"]


def test_sessionize_committed_slice(tmp_path):
    out, s = sessionize_trace(read_trace(SLICE))
    assert s == {"rows": 1750, "sessions": 1212, "multi_turn_sessions": 381, "max_turns": 9}
    # each continuing row starts with its previous turn's full blocks
    prev: dict[str, int] = {}
    for i, sid in enumerate(out.session_id):
        if sid in prev:
            p = out.hash_ids(prev[sid])[:-1]
            assert p.size >= 1 and out.hash_ids(i)[: p.size].tolist() == p.tolist()
        prev[sid] = i


# --------------------------------------------------------------------------------------------
# synth writes turn


def test_synth_writes_turn(tmp_path):
    t = synth(SynthSpec(rows=14, rate_per_s=10, turns=3, sessions=2, seed=1))
    assert t.session_id[:6] == ["s0", "s1", "s0", "s1", "s0", "s1"]
    assert t.turn == [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2, 0, 0]
    assert synth(SynthSpec(rows=5, rate_per_s=10)).turn is None
    p = tmp_path / "syn.parquet"
    write_synth(SynthSpec(rows=50, rate_per_s=10, turns=4, sessions=3, seed=2), p, row_group_rows=12)
    back = read_trace(p)  # turn order is valid
    for sid in set(back.session_id):
        turns = [back.turn[i] for i, s in enumerate(back.session_id) if s == sid]
        assert turns == list(range(len(turns)))
