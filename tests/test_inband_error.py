"""A server's error inside a 200 stream, in the shapes the engines send it: llama.cpp's server
before it moved to ``data:`` lines writes ``error: {"code", "message", "type"}`` (an SSE field the
WHATWG decoder ignores, followed by ``data: [DONE]`` on its OpenAI endpoints), later llama.cpp,
vLLM and SGLang ``data: {"error": {...}}``. Each is a failed request (``stream_error``) with the
server's message, in the results row and the summary's errors by kind."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from conftest import replay_against
from faultserver import ABORT, DONE, Plan, ThreadedFaultServer, choice, sse

from replayer.core import ErrorKind
from replayer.http import SSEDecoder, StreamAccumulator

LLAMA_CPP = b'error: {"code":500,"message":"Compute error.","type":"server_error"}\n\n'
CONTEXT = (
    b'error: {"code":400,"message":"the request exceeds the available context size, try increasing it",'
    b'"type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}\n\n'
)


def _decode(reads: list[bytes]) -> tuple[StreamAccumulator, SSEDecoder]:
    dec, acc = SSEDecoder(), StreamAccumulator()
    for i, r in enumerate(reads):
        data = dec.simple_event(r)
        for ev in [data] if data is not None else [e.data for e in dec.feed(r)]:
            acc.on_event(ev, i)
    dec.close()
    for value in dec.errors:
        acc.on_error_field(value)
    acc.finish()
    return acc, dec


def test_the_decoder_keeps_llama_cpps_error_field_out_of_the_events():
    whole = choice("a") + LLAMA_CPP + DONE
    dec = SSEDecoder()
    events = [e.data for e in dec.feed(whole)]
    assert events == ['{"choices":[{"index":0,"text":"a","finish_reason":null}]}', "[DONE]"]
    assert dec.errors == [LLAMA_CPP[len("error: ") : -2].decode()]
    for cut in range(1, len(whole)):  # wherever a read ends, the same error and events
        acc, dec = _decode([whole[:cut], whole[cut:]])
        assert acc.error_kind is ErrorKind.STREAM_ERROR and acc.error == "Compute error." and len(dec.errors) == 1
        assert acc.n_chunks == 1 and not acc.success
    acc, _ = _decode([choice("a"), b"error: not json\n\n"])
    assert acc.error_kind is ErrorKind.STREAM_ERROR and acc.error == "not json"
    acc, _ = _decode([choice("a", finish="stop"), DONE])  # (no error field: as before)
    assert acc.success and SSEDecoder().errors == []


#: one plan per row, in the trace's order (the k-th request the server receives gets the k-th)
PLANS = [
    # llama.cpp's OpenAI endpoints: tokens, the error field, then [DONE] (read as a success before)
    Plan([(0, choice("a")), (10, choice("b")), (20, LLAMA_CPP), (21, DONE)]),
    # its native endpoints: the error field ends the stream (read as a stream cut short before)
    Plan([(0, choice("a")), (10, CONTEXT)]),
    # the error field, then the connection reset: the server's message, not the disconnect
    Plan([(0, choice("a")), (10, LLAMA_CPP), (20, ABORT)]),
    # later llama.cpp: data: {"error": {...}}
    Plan(
        [
            (0, choice("a")),
            (10, sse({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})),
            (11, DONE),
        ]
    ),
    # vLLM / SGLang: data: {"error": {...}} before any token
    Plan(
        [(0, sse({"error": {"message": "KV cache exhausted", "type": "InternalServerError", "code": 500}})), (1, DONE)]
    ),
    Plan([(0, choice("a")), (10, choice("b", finish="length")), (11, DONE)]),
]
MESSAGES = [
    "Compute error.",
    "the request exceeds the available context size, try increasing it",
    "Compute error.",
    "Loading model",
    "KV cache exhausted",
    None,
]


def test_a_run_records_each_shape_of_in_band_error_with_the_servers_message(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": 300 * i, "input_length": 4, "output_length": 2, "hash_ids": [1]}) + "\n"
            for i in range(len(PLANS))
        )
    )
    with ThreadedFaultServer(PLANS) as srv:
        p = replay_against(trace, srv.url, tmp_path / "r")
    assert p.returncode == 0, p.stderr[-2000:]
    rows = sorted(
        pq.read_table(
            tmp_path / "r" / "requests.parquet", columns=["row", "outcome", "error_kind", "error"]
        ).to_pylist(),
        key=lambda r: r["row"],
    )
    assert [r["error"] for r in rows] == MESSAGES
    assert [r["error_kind"] for r in rows] == ["stream_error"] * 5 + ["none"]
    assert [r["outcome"] for r in rows] == ["failed"] * 5 + ["success"]
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["errors_by_kind"] == {"stream_error": 5} and s["completed"] == 1 and s["failed"] == 5
