"""Tests for replayer.http.sse: the SSE decoder (WHATWG grammar, every split position) and the OpenAI
stream accumulator (exact values of client-faults cases B02, B04, B05, B06, B08, B09, B11, B13,
B25, plus continuous-usage ITL invariants and split-invariance properties)."""

from __future__ import annotations

import re
import statistics
import time

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from replayer.core import ErrorKind
from replayer.http import SSEDecoder, StreamAccumulator
from replayer.http.sse import SSEEvent

MS = 1_000_000


# ----------------------------------------------------------------------------------------------
# helpers


def decode_all(chunks: list[bytes]) -> tuple[list[SSEEvent], bool]:
    dec = SSEDecoder()
    out: list[SSEEvent] = []
    for c in chunks:
        out.extend(dec.feed(c))
    return out, dec.close()


def splits_of(b: bytes):
    """Yield chunkings of b: one read, 1-byte reads, 3-byte reads, every 2-way split."""
    yield "one", [b]
    yield "1-byte", [b[i : i + 1] for i in range(len(b))]
    yield "3-byte", [b[i : i + 3] for i in range(0, len(b), 3)]
    for p in range(len(b) + 1):
        yield f"split@{p}", [b[:p], b[p:]]


def ref_decode(b: bytes) -> tuple[list[SSEEvent], bool]:
    """Spec-literal reference: decode the whole stream, then walk its lines."""
    s = b.decode("utf-8", "replace")
    if s.startswith("\ufeff"):
        s = s[1:]
    lines = re.split(r"\r\n|\r|\n", s)
    partial = lines.pop()
    events: list[SSEEvent] = []
    data: list[str] = []
    etype, last_id, retry = "", None, None
    fields = False  # a data/event/retry field of an undispatched event was seen
    for line in lines:
        if line == "":
            if data:
                events.append(SSEEvent("\n".join(data), etype, last_id, retry))
            data, etype, retry, fields = [], "", None, False
            continue
        if line.startswith(":"):
            continue
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
            fields = True
        elif name == "event":
            etype = value
            fields = True
        elif name == "id":
            if "\0" not in value:
                last_id = value
        elif name == "retry":
            if value and all(c in "0123456789" for c in value):
                retry = int(value)
                fields = True
    pending = bool(partial) or fields
    return events, pending


def run(transcript, accumulator=None, splitter=None) -> StreamAccumulator:
    """Feed a transcript [(ms, bytes), ...] through SSEDecoder -> StreamAccumulator; each item is
    one read stamped ms * 1e6 ns (``splitter`` may cut an item into several reads, same stamp)."""
    dec = SSEDecoder()
    acc = accumulator or StreamAccumulator(keep_text=True)
    for ms, b in transcript:
        pieces = splitter(b) if splitter else [b]
        for piece in pieces:
            for ev in dec.feed(piece):
                acc.on_event(ev.data, ms * MS)
    dec.close()
    acc.finish()
    return acc


def metrics(acc: StreamAccumulator) -> dict:
    f, last = acc.first_token_ns, acc.last_token_ns
    return {
        "success": acc.success,
        "kind": acc.error_kind,
        "error": acc.error,
        "ttft": None if f is None else f / MS,
        "e2e": None if last is None else last / MS,
        "tpot": acc.tpot_ms(),
        "itl": acc.itl_ms(),
        "N": acc.output_tokens,
        "prompt": acc.prompt_tokens,
        "completion": acc.completion_tokens,
        "usage_seen": acc.usage_seen,
        "n_chunks": acc.n_chunks,
        "finish": acc.finish_reason,
        "done": acc.done_seen,
        "text": acc.text,
    }


# ----------------------------------------------------------------------------------------------
# transcripts from shared/cases/client-faults.md

B02 = [
    (50, b"data:"),
    (51, b' {"choices":[{"index":0,"text":" a'),
    (52, b' b","finish_reason":null}]}\n\ndata: {"choices":[{"index":0,"text":"c","finish_reason":"length"}]}\n'),
    (53, b'\ndata: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3,"total_tokens":7}}\n\nda'),
    (54, b"ta: [DONE]\n\n"),
]
B04 = [
    (120, b'data: {"choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n'),
    (150, b'data: {"choices":[{"index":0,"text":"y","finish_reason":null}]}\n\n'),
    (180, b'data: {"choices":[{"index":0,"text":"z","finish_reason":"length"}]}\n\n'),
    (900, b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}\n\n'),
    (901, b"data: [DONE]\n\n"),
]
B05_R1 = [
    (100, b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'),
    (120, b'data: {"choices":[{"index":0,"text":"b","finish_reason":"length"}]}\n\n'),
    (121, b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}\n\n'),
    (122, b"data: [DONE]\n\n"),
]
B05_R2 = [
    (30, b'data: {"choices":[{"index":0,"text":"","finish_reason":null}]}\n\n'),
    (2000, b'data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}\n\n'),
    (2001, b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}\n\n'),
    (2002, b"data: [DONE]\n\n"),
]
B06_A = [
    (40, b'data: {"error":{"message":"engine failure","type":"InternalServerError","code":500}}\n\n'),
    (41, b"data: [DONE]\n\n"),
]
B06_B = [
    (60, b'data: {"choices":[{"index":0,"text":"ok","finish_reason":null}]}\n\n'),
    (90, b'data: {"error":{"message":"engine failure","type":"InternalServerError","code":500}}\n\n'),
    (91, b"data: [DONE]\n\n"),
]
B08_A = [
    (
        75,
        b'data: {"choices":[{"index":0,"text":"OK","finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}\n\n',
    ),
    (76, b"data: [DONE]\n\n"),
]
B08_B = [
    (75, b'data: {"choices":[{"index":0,"text":"OK","finish_reason":"stop"}]}\n\n'),
    (300, b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}\n\n'),
    (301, b"data: [DONE]\n\n"),
]
B09 = [
    (80, b'data:{"choices":[{"index":0,"text":"Hi","finish_reason":null}]}\r\n\r\n'),
    (95, b'data:{"choices":[{"index":0,"text":"!","finish_reason":"length"}]}\r\n\r\n'),
    (96, b'data:{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}\r\n\r\n'),
    (97, b"data:[DONE]\r\n\r\n"),
]
B11_A = [
    (50, b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'),
    (70, b'data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}\n\n'),
    (71, b'data: {"choices":[],"usage":{"prompt_tokens":26,"completion_tokens":2,"total_tokens":28}}\n\n'),
    (72, b"data: [DONE]\n\n"),
]
B11_B = [
    (50, b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'),
    (
        70,
        b'data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}],"usage":{"prompt_tokens":26,"completion_tokens":2,"total_tokens":28}}\n\n',
    ),
    (71, b'data: {"choices":[],"usage":null}\n\n'),
    (72, b"data: [DONE]\n\n"),
]
B13_S = [(35, b'data: {"error":"Request failed during generation: out of memory"}\n\n'), (36, b"data: [DONE]\n\n")]
B13_U = b'{"error":{"message":"model overloaded","type":"server_error","code":503}}'
B25 = [
    (60, b'data: {"choices":[{"index":0,"text":"x","finish_reason":"length"}]}\n\n'),
    (61, b'data: {"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":1,"total_tokens":101}}\n\n'),
    (62, b"data: [DONE]\n\n"),
]

# A chat stream with a role-only first chunk, reasoning tokens, a keep-alive comment and event/id/retry
CHAT = [
    (
        10,
        b': keep-alive\n\nretry: 3000\nid: 1\nevent: message\ndata: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n',
    ),
    (40, b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"think"},"finish_reason":null}]}\n\n'),
    (55, b'data: {"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}\n\n: ping\n\n'),
    (70, b'data: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}\n\n'),
    (71, b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}\n\n'),
    (72, b"data: [DONE]\n\n"),
]

# Continuous usage (vLLM continuous_usage_stats): multi-token chunks, a zero-token chunk,
# and an empty-text stop token that still carries one token.
CONT = [
    (
        100,
        b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}\n\n',
    ),
    (
        130,
        b'data: {"choices":[{"index":0,"text":"bc","finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}\n\n',
    ),
    (
        150,
        b'data: {"choices":[{"index":0,"text":"","finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}\n\n',
    ),
    (
        190,
        b'data: {"choices":[{"index":0,"text":"defg","finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}\n\n',
    ),
    (
        200,
        b'data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":8,"total_tokens":11}}\n\n',
    ),
    (201, b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":8,"total_tokens":11}}\n\n'),
    (202, b"data: [DONE]\n\n"),
]

CR_ONLY = b'data: {"choices":[{"text":"a"}]}\r\r: c\rdata:x\rdata:y\r\rdata: [DONE]\r\r'
MIXED = (
    b"\xef\xbb\xbf: hello\n\nevent: update\nid: 7\nretry: 15\ndata: first\ndata:second\n\n"
    b"data\n\nid\x00x: ignored\ndata:  two spaces\r\n\r\nretry: 1a\nunknown: z\ndata: \xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80\n\n"
    b"event: lonely\n\nid: \x00\ndata: after-nul-id\n\ndata: tail-without-blank\n"
)

RECORDED = {
    "B02": b"".join(b for _, b in B02),
    "B04": b"".join(b for _, b in B04),
    "B09": b"".join(b for _, b in B09),
    "CHAT": b"".join(b for _, b in CHAT),
    "CONT": b"".join(b for _, b in CONT),
    "CR_ONLY": CR_ONLY,
    "MIXED": MIXED,
}


# ----------------------------------------------------------------------------------------------
# decoder


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_decoder_every_split_gives_same_events(name):
    stream = RECORDED[name]
    expected = ref_decode(stream)
    assert expected[0], "reference found no events"
    for how, chunks in splits_of(stream):
        assert decode_all(chunks) == expected, (name, how)


def test_decoder_b02_events():
    events, pending = decode_all([b for _, b in B02])
    assert [e.data for e in events] == [
        '{"choices":[{"index":0,"text":" a b","finish_reason":null}]}',
        '{"choices":[{"index":0,"text":"c","finish_reason":"length"}]}',
        '{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3,"total_tokens":7}}',
        "[DONE]",
    ]
    assert pending is False


def test_decoder_b09_crlf_no_space():
    events, pending = decode_all([b for _, b in B09])
    assert len(events) == 4 and events[-1].data == "[DONE]"
    assert events[0].data.startswith('{"choices"') and not pending


def test_decoder_mixed_fields():
    events, pending = decode_all([MIXED])
    assert events == [
        SSEEvent("first\nsecond", "update", "7", 15),
        SSEEvent("", "", "7", None),  # "data" with no colon: one empty data line
        SSEEvent(" two spaces", "", "7", None),  # only one space removed; id with NUL ignored
        SSEEvent("é日😀", "", "7", None),  # retry "1a" ignored, unknown field ignored
        SSEEvent("after-nul-id", "", "7", None),  # the event-only block is not dispatched
    ]
    assert pending is True  # "tail-without-blank" never dispatched


def test_decoder_line_ends():
    for eol in (b"\n", b"\r", b"\r\n"):
        s = b"data: a" + eol + b"data: b" + eol + eol + b"data: c" + eol + eol
        assert [e.data for e in decode_all([s])[0]] == ["a\nb", "c"], eol


def test_decoder_cr_lf_split_across_reads_is_one_line_end():
    dec = SSEDecoder()
    assert dec.feed(b"data: a\r") == []
    # The LF completes the CRLF of line "data: a"; it is not a blank line.
    assert dec.feed(b"\ndata: b\r\n\r") == [SSEEvent("a\nb")]
    assert dec.feed(b"\n") == []
    assert dec.feed(b"data: c\r") == []
    assert dec.feed(b"\r") == [SSEEvent("c")]  # dispatched at the CR, not later
    assert dec.feed(b"\n\n") == []  # LF skipped, then a harmless blank line
    assert dec.close() is False


def test_decoder_cr_then_empty_feed_then_lf():
    dec = SSEDecoder()
    assert dec.feed(b"data: a\r") == []
    assert dec.feed(b"") == []
    assert dec.feed(b"\ndata: b\n\n") == [SSEEvent("a\nb")]


def test_decoder_data_with_and_without_space():
    assert decode_all([b"data:x\n\ndata: x\n\ndata:  x\n\ndata:\n\n"])[0] == [
        SSEEvent("x"),
        SSEEvent("x"),
        SSEEvent(" x"),
        SSEEvent(""),
    ]


def test_decoder_comments_and_meta_only_blocks_not_dispatched():
    events, pending = decode_all([b": keep-alive\n\n:\n\nid: 5\n\nretry: 100\n\nevent: x\n\n"])
    assert events == [] and pending is False
    dec = SSEDecoder()
    dec.feed(b"id: 5\n\nretry: 100\n\n")
    assert dec.last_event_id == "5" and dec.retry == 100
    assert dec.feed(b"data: y\n\n") == [SSEEvent("y", "", "5", None)]


def test_decoder_missing_final_blank_line():
    dec = SSEDecoder()
    assert dec.feed(b'data: {"a":1}\n\ndata: {"b":2}\n') == [SSEEvent('{"a":1}')]
    assert dec.close() is True
    dec = SSEDecoder()
    assert dec.feed(b"data: x\n\nda") == [SSEEvent("x")]
    assert dec.close() is True  # partial line
    dec = SSEDecoder()
    dec.feed(b"data: x\n\n")
    assert dec.close() is False


def test_decoder_bom_and_split_bom():
    s = b"\xef\xbb\xbfdata: x\n\n"
    for _, chunks in splits_of(s):
        assert decode_all(chunks) == ([SSEEvent("x")], False)
    # only a leading BOM is dropped
    assert decode_all([b"data: \xef\xbb\xbfx\n\n"])[0] == [SSEEvent("\ufeffx")]


def test_decoder_utf8_split_mid_character():
    s = "data: é日😀 ok\n\n".encode()
    for how, chunks in splits_of(s):
        assert decode_all(chunks) == ([SSEEvent("é日😀 ok")], False), how


def test_decoder_invalid_utf8_replaced():
    assert decode_all([b"data: a\xffb\n\n"])[0] == [SSEEvent("a\ufffdb")]


def test_decoder_300kib_event():
    payload = ("x" * 1000 + "é") * 310
    body = ('{"choices":[{"text":"' + payload + '"}]}').encode()
    s = b"data: " + body + b"\n\ndata: [DONE]\n\n"
    assert len(body) > 300 * 1024
    expected = ([SSEEvent(body.decode()), SSEEvent("[DONE]")], False)
    t0 = time.perf_counter()
    assert decode_all([s]) == expected
    assert decode_all([s[i : i + 4096] for i in range(0, len(s), 4096)]) == expected
    assert decode_all([s[i : i + 3] for i in range(0, len(s), 3)]) == expected
    crlf = s.replace(b"\n", b"\r\n")
    assert decode_all([crlf[i : i + 3] for i in range(0, len(crlf), 3)]) == expected
    assert time.perf_counter() - t0 < 10  # linear, not quadratic, in the number of reads


def test_decoder_accepts_bytearray_and_memoryview():
    dec = SSEDecoder()
    assert dec.feed(bytearray(b"data: a\n")) == []
    assert dec.feed(memoryview(b"\n")) == [SSEEvent("a")]


# ----------------------------------------------------------------------------------------------
# accumulator: the cases' exact values


def test_b02_split_reads():
    m = metrics(run(B02))
    assert m["success"] and m["kind"] is ErrorKind.NONE and m["error"] is None
    assert m["text"] == " a bc"
    assert m["N"] == 3 and m["completion"] == 3 and m["prompt"] == 4
    assert m["ttft"] == 52 and m["e2e"] == 53
    assert m["n_chunks"] == 2 and m["done"]
    assert m["tpot"] == 0.5 and m["itl"] == []  # 2 text events for N = 3: per-event counts unknown


def test_b04_usage_only_chunk_does_not_extend_e2e():
    m = metrics(run(B04))
    assert m["success"]
    assert m["ttft"] == 120 and m["e2e"] == 180 and m["N"] == 3
    assert m["tpot"] == 30.0 and m["itl"] == [30.0, 30.0]
    assert sum(m["itl"]) == m["e2e"] - m["ttft"] == 60


def test_b05_unmeasured_ttft():
    r1, r2, r3 = (metrics(run(t)) for t in (B05_R1, B05_R2, B05_R2))
    assert r1["success"] and r1["ttft"] == 100 and r1["e2e"] == 120 and r1["tpot"] == 20.0
    assert r1["itl"] == [20.0] and r1["N"] == 2
    for r in (r2, r3):
        assert r["success"]  # a success, but with no measurable first token
        assert r["ttft"] is None and r["tpot"] is None and r["itl"] == []
        assert r["e2e"] == 2000 and r["N"] == 2 and r["prompt"] == 9
    rs = [r1, r2, r3]
    ttfts = [r["ttft"] for r in rs if r["ttft"] is not None]
    assert ttfts == [100] and statistics.mean(ttfts) == statistics.median(ttfts) == 100
    assert [r["tpot"] for r in rs if r["tpot"] is not None] == [20.0]
    assert sum(r["ttft"] is None for r in rs) == 2
    assert sum(r["N"] for r in rs if r["success"]) == 6


@pytest.mark.parametrize("tr,n_chunks", [(B06_A, 0), (B06_B, 1)])
def test_b06_in_band_error_fails(tr, n_chunks):
    acc = run(tr)
    assert acc.success is False and acc.error_kind is ErrorKind.STREAM_ERROR
    assert acc.error == "engine failure"
    assert acc.completion_tokens is None and acc.usage_seen is False  # never max_tokens
    assert acc.n_chunks == n_chunks  # B's partial output


@pytest.mark.parametrize("tr", [B08_A, B08_B], ids=["A", "B"])
def test_b08_whole_answer_in_first_chunk(tr):
    m = metrics(run(tr))
    assert m["success"]
    assert m["ttft"] == 75 and m["e2e"] == 75 and m["N"] == 1 and m["prompt"] == 12
    assert m["tpot"] is None and m["itl"] == []
    assert m["finish"] == "stop"


def test_b09_crlf_and_no_space():
    m = metrics(run(B09))
    assert m["success"] and m["n_chunks"] == 2 and m["done"]
    assert m["N"] == 2 and m["ttft"] == 80 and m["e2e"] == 95 and m["tpot"] == 15.0
    assert m["itl"] == [15.0] and m["text"] == "Hi!"


@pytest.mark.parametrize("tr", [B11_A, B11_B], ids=["A", "B"])
def test_b11_usage_in_trailing_empty_choices_chunk(tr):
    acc = run(tr)
    m = metrics(acc)
    assert m["success"] and m["usage_seen"]
    assert m["prompt"] == 26 and m["completion"] == 2
    assert m["ttft"] == 50 and m["e2e"] == 70
    assert m["tpot"] == 20.0
    # The empty-text stop chunk carries the token usage says is missing: sum(ITL) == E2E - TTFT.
    assert m["itl"] == [20.0]


def test_b13_error_stream_and_error_body():
    s = run(B13_S)
    assert not s.success and s.error_kind is ErrorKind.STREAM_ERROR
    assert s.error == "Request failed during generation: out of memory"
    assert s.completion_tokens is None
    u = StreamAccumulator()
    u.on_body(B13_U, 40 * MS)
    u.finish()
    assert not u.success and u.error_kind is ErrorKind.STREAM_ERROR
    assert u.error == "model overloaded" and u.completion_tokens is None
    assert u.tpot_ms() is None and u.itl_ms() == []


def test_b25_one_token():
    m = metrics(run(B25))
    assert m["success"] and m["ttft"] == 60 and m["e2e"] == 60 and m["N"] == 1
    assert m["tpot"] is None and m["itl"] == []


def test_continuous_usage_multi_token_chunks():
    m = metrics(run(CONT))
    assert m["success"] and m["N"] == 8 and m["prompt"] == 3
    assert m["ttft"] == 100 and m["e2e"] == 200
    # k = 1, 2, 0 (merged into the next gap), 4, 1 (empty-text stop token, counted from usage)
    assert m["itl"] == [15.0, 15.0, 15.0, 15.0, 15.0, 15.0, 10.0]
    assert len(m["itl"]) == m["N"] - 1
    assert sum(m["itl"]) == pytest.approx(m["e2e"] - m["ttft"])
    assert statistics.mean(m["itl"]) == pytest.approx(m["tpot"]) == pytest.approx(100 / 7)


def test_chat_role_chunk_and_reasoning_tokens():
    m = metrics(run(CHAT))
    assert m["success"] and m["n_chunks"] == 4
    assert m["ttft"] == 40  # reasoning_content counts; the role-only chunk does not
    assert m["e2e"] == 70 and m["N"] == 3 and m["tpot"] == 15.0
    assert m["itl"] == [15.0, 15.0] and m["text"] == "Hello"


def test_continuous_usage_role_chunk_with_zero_usage_is_not_a_token():
    def u(n: int) -> str:
        return ',"usage":{"prompt_tokens":2,"completion_tokens":%d,"total_tokens":%d}' % (n, n + 2)

    tr = [
        (
            5,
            (
                'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]%s}\n\n'
                % u(0)
            ).encode(),
        ),
        (20, ('data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]%s}\n\n' % u(1)).encode()),
        (
            30,
            ('data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"length"}]%s}\n\n' % u(2)).encode(),
        ),
        (31, b"data: [DONE]\n\n"),
    ]
    m = metrics(run(tr))
    assert m["success"] and m["ttft"] == 20 and m["e2e"] == 30 and m["itl"] == [10.0] and m["tpot"] == 10.0


def test_continuous_usage_when_role_chunk_has_no_usage():
    def u(n: int) -> str:
        return ',"usage":{"prompt_tokens":2,"completion_tokens":%d,"total_tokens":%d}' % (n, n + 2)

    tr = [
        (5, b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'),
        (20, ('data: {"choices":[{"index":0,"delta":{"content":"ab"},"finish_reason":null}]%s}\n\n' % u(1)).encode()),
        (30, ('data: {"choices":[{"index":0,"delta":{"content":"cd"},"finish_reason":null}]%s}\n\n' % u(3)).encode()),
        (40, ('data: {"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]%s}\n\n' % u(4)).encode()),
        (41, b"data: [DONE]\n\n"),
    ]
    m = metrics(run(tr))
    assert m["success"] and m["N"] == 4 and m["ttft"] == 20 and m["e2e"] == 40
    assert m["itl"] == [5.0, 5.0, 10.0] and m["tpot"] == 20 / 3


# ----------------------------------------------------------------------------------------------
# accumulator: failure kinds, error shapes, usage rules


def events_to_transcript(*datas: str, start: int = 10, step: int = 10):
    return [(start + i * step, b"data: " + d.encode() + b"\n\n") for i, d in enumerate(datas)]


@pytest.mark.parametrize(
    "data,msg",
    [
        ('{"error":{"message":"m1","type":"x"}}', "m1"),
        ('{"error":"plain text"}', "plain text"),
        ('{"object":"error","message":"old vllm","type":"BadRequestError","param":null,"code":400}', "old vllm"),
        ('{"error":{"error":{"message":"deep"}}}', "deep"),
        ('{"error":{"code":500}}', '{"code":500}'),
    ],
)
def test_error_shapes(data, msg):
    acc = run(events_to_transcript('{"choices":[{"text":"a"}]}', data, "[DONE]"))
    assert not acc.success and acc.error_kind is ErrorKind.STREAM_ERROR and acc.error == msg


def test_error_after_finish_and_usage_still_fails_and_is_truncated():
    long = "e" * 2000
    acc = run(
        events_to_transcript(
            '{"choices":[{"text":"a","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}',
            orjson.dumps({"error": {"message": long}}).decode(),
            "[DONE]",
        )
    )
    assert not acc.success and acc.error_kind is ErrorKind.STREAM_ERROR
    assert acc.error == "e" * 500


def test_error_in_same_event_as_choices():
    acc = run(events_to_transcript('{"choices":[{"text":"a","finish_reason":"stop"}],"error":"boom"}'))
    assert not acc.success and acc.error == "boom" and acc.n_chunks == 1


def test_usage_null_never_erases_and_last_usage_wins():
    acc = run(
        events_to_transcript(
            '{"choices":[{"text":"a"}],"usage":{"prompt_tokens":4,"completion_tokens":1}}',
            '{"choices":[{"text":"b","finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":2}}',
            '{"choices":[],"usage":null}',
            '{"choices":[]}',
            "[DONE]",
        )
    )
    assert acc.success and acc.prompt_tokens == 4 and acc.completion_tokens == 2


def test_invalid_json_is_protocol():
    acc = run(events_to_transcript('{"choices":[{"text":"a"}]}', '{"choices":[{"te', "[DONE]"))
    assert not acc.success and acc.error_kind is ErrorKind.PROTOCOL
    assert acc.error.startswith("invalid JSON in SSE event")


def test_stream_without_end_is_incomplete():
    acc = run(events_to_transcript('{"choices":[{"text":"a"}]}', '{"choices":[{"text":"b"}]}'))
    assert not acc.success and acc.error_kind is ErrorKind.INCOMPLETE
    assert acc.first_token_ns == 10 * MS and acc.last_token_ns == 20 * MS  # kept as partial
    empty = run([])
    assert not empty.success and empty.error_kind is ErrorKind.INCOMPLETE


def test_done_only_stream_is_protocol():
    acc = run(events_to_transcript("[DONE]"))
    assert not acc.success and acc.error_kind is ErrorKind.PROTOCOL


def test_zero_token_success_is_still_success():
    acc = run(
        events_to_transcript(
            '{"choices":[{"text":"","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":0}}',
            "[DONE]",
        )
    )
    assert acc.success and acc.completion_tokens == 0 and acc.first_token_ns is None
    assert acc.last_token_ns == 10 * MS and acc.tpot_ms() is None


def test_no_usage_leaves_n_tpot_and_itl_unknown_and_the_event_count_an_estimate():
    acc = run(
        events_to_transcript(
            '{"choices":[{"text":"a"}]}',
            '{"choices":[{"text":"b"}]}',
            '{"choices":[{"text":"c","finish_reason":"length"}]}',
            "[DONE]",
        )
    )
    assert acc.success and not acc.usage_seen and acc.completion_tokens is None
    assert acc.output_tokens is None and acc.tpot_ms() is None and acc.itl_ms() == []
    assert acc.output_tokens_estimate == 3
    assert acc.first_token_ns == 10 * MS and acc.last_token_ns == 30 * MS  # TTFT and E2E stay measured


def test_keepalive_empty_data_ignored():
    acc = run(events_to_transcript("", '{"choices":[{"text":"a","finish_reason":"stop"}]}', "[DONE]"))
    assert acc.success and acc.first_token_ns == 20 * MS


def test_non_stream_bodies():
    acc = StreamAccumulator(keep_text=True)
    acc.on_body(
        b'{"choices":[{"index":0,"message":{"role":"assistant","content":"hi there"},"finish_reason":"stop"}],'
        b'"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}',
        250 * MS,
    )
    acc.finish()
    assert acc.success and acc.prompt_tokens == 5 and acc.completion_tokens == 2 and acc.text == "hi there"
    assert acc.first_token_ns == acc.last_token_ns == 250 * MS
    assert acc.tpot_ms() is None and acc.itl_ms() == []
    for body, kind, err in [
        (b'{"id":"x","object":"text_completion","choices":[]}', ErrorKind.PROTOCOL, None),
        (b'{"detail":"Not Found"}', ErrorKind.PROTOCOL, "Not Found"),
        (b"Internal Server Error", ErrorKind.PROTOCOL, "Internal Server Error"),
        (b"", ErrorKind.PROTOCOL, "empty response body"),
        (b'{"object":"error","message":"bad","code":400}', ErrorKind.STREAM_ERROR, "bad"),
    ]:
        a = StreamAccumulator()
        a.on_body(body, 1)
        a.finish()
        assert not a.success and a.error_kind is kind, body
        if err is not None:
            assert a.error == err
        assert a.error


def test_measurements_readable_before_finish():
    acc = StreamAccumulator()
    acc.on_event('{"choices":[{"text":"a"}]}', 10 * MS)
    acc.on_event('{"choices":[{"text":"b"}]}', 25 * MS)
    assert acc.first_token_ns == 10 * MS and acc.last_token_ns == 25 * MS
    assert acc.itl_ms() == [] and acc.tpot_ms() is None and acc.success is False  # N unknown yet
    acc.on_event('{"choices":[{"text":"","finish_reason":"stop"}]}', 40 * MS)
    assert acc.last_token_ns == 40 * MS and acc.tpot_ms() is None and acc.output_tokens_estimate == 2
    acc.on_event('{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3}}', 41 * MS)
    assert acc.output_tokens == 3 and acc.tpot_ms() == 15.0 and acc.itl_ms() == [15.0, 15.0]
    acc.finish()
    assert acc.success


def test_trailing_stop_token_in_same_read_as_last_text():
    tr = [
        (10, b'data: {"choices":[{"text":"a"}]}\n\n'),
        (20, b'data: {"choices":[{"text":"b"}]}\n\ndata: {"choices":[{"text":"","finish_reason":"stop"}]}\n\n'),
        (21, b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3}}\n\ndata: [DONE]\n\n'),
    ]
    acc = run(tr)
    assert acc.success and acc.tpot_ms() == 5.0 and acc.itl_ms() == [10.0, 0.0]
    assert sum(acc.itl_ms()) == (acc.last_token_ns - acc.first_token_ns) / MS


# ----------------------------------------------------------------------------------------------
# properties

_value_text = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=12)
_line = st.one_of(
    st.builds(lambda v, sp: "data:" + (" " if sp else "") + v, _value_text, st.booleans()),
    st.builds(lambda v: "event: " + v, _value_text),
    st.builds(lambda v: "id:" + v, _value_text | st.just("a\0b")),
    st.builds(lambda v: "retry: " + v, st.from_regex(r"[0-9]{1,4}", fullmatch=True) | _value_text),
    st.builds(lambda v: ":" + v, _value_text),
    st.builds(lambda v: v, _value_text),
    st.just(""),
    st.just(""),
    st.just("data"),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(st.tuples(_line, st.sampled_from(["\n", "\r", "\r\n"])), max_size=25),
    bom=st.booleans(),
    tail=_value_text,
    cuts=st.lists(st.integers(0, 2000), max_size=12),
)
def test_decoder_matches_reference_at_any_split(lines, bom, tail, cuts):
    s = ("\ufeff" if bom else "") + "".join(text + e for text, e in lines) + tail
    b = s.encode()
    expected = ref_decode(b)
    pos = sorted({c % (len(b) + 1) for c in cuts})
    chunks = [b[i:j] for i, j in zip([0] + pos, pos + [len(b)])]
    assert decode_all(chunks) == expected
    assert decode_all([b[i : i + 1] for i in range(len(b))]) == expected


def _event_json(kind: int, text: str, total: int | None, finish: str | None) -> str:
    obj: dict = {}
    if kind == 0:
        obj["choices"] = [{"index": 0, "text": text, "finish_reason": finish}]
    elif kind == 1:
        obj["choices"] = [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]
    elif kind == 2:
        obj["choices"] = []
    elif kind == 3:
        return '{"error":{"message":"boom"}}'
    if total is not None:
        obj["usage"] = {"prompt_tokens": 7, "completion_tokens": total, "total_tokens": total + 7}
    return orjson.dumps(obj).decode()


@st.composite
def _streams(draw):
    n = draw(st.integers(0, 12))
    cont = draw(st.booleans())
    total = 0
    parts: list[bytes] = []
    for i in range(n):
        kind = draw(st.sampled_from([0, 0, 0, 1, 1, 2, 3] if draw(st.integers(0, 9)) == 0 else [0, 0, 1, 2]))
        text = draw(st.sampled_from(["", "a", " b", "é", "日本"]))
        total += draw(st.integers(0, 3))
        usage = total if (cont or kind == 2 or draw(st.integers(0, 4)) == 0) else None
        finish = "stop" if i == n - 1 and draw(st.booleans()) else None
        data = _event_json(kind, text, usage, finish)
        eol = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
        sp = draw(st.sampled_from([b"data: ", b"data:"]))
        if draw(st.integers(0, 5)) == 0:
            parts.append(b": keep-alive" + eol + eol)
        parts.append(sp + data.encode() + eol + eol)
    if draw(st.booleans()):
        parts.append(b"data: [DONE]\n\n")
    stream = b"".join(parts)
    cuts = sorted(set(draw(st.lists(st.integers(0, max(len(stream), 1)), max_size=15))))
    bounds = [0] + [c for c in cuts if 0 < c < len(stream)] + [len(stream)]
    t, transcript = 0, []
    for i, j in zip(bounds, bounds[1:]):
        t += draw(st.integers(0, 50))
        transcript.append((t, stream[i:j]))
    return transcript


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tr=_streams(), sub=st.integers(1, 7))
def test_accumulator_independent_of_read_splits(tr, sub):
    base = metrics(run(tr))
    by_sub = metrics(run(tr, splitter=lambda b: [b[i : i + sub] for i in range(0, len(b), sub)]))
    by_byte = metrics(run(tr, splitter=lambda b: [b[i : i + 1] for i in range(len(b))]))
    assert base == by_sub == by_byte
    # invariants of the definitions
    if base["ttft"] is not None:
        assert base["e2e"] is not None and base["e2e"] >= base["ttft"]
        assert sum(base["itl"]) <= base["e2e"] - base["ttft"] + 1e-9
    if base["tpot"] is not None:
        assert base["N"] >= 2 and base["ttft"] is not None
    if base["kind"] is ErrorKind.STREAM_ERROR:
        assert base["error"] == "boom" and not base["success"]


@settings(max_examples=200, deadline=None)
@given(
    ks=st.lists(st.integers(0, 4), min_size=1, max_size=30),
    gaps=st.lists(st.integers(0, 80), min_size=32, max_size=32),
    stop_token=st.booleans(),
)
def test_continuous_usage_itl_invariants(ks, gaps, stop_token):
    """With running-total usage and a first chunk of one token: mean(ITL) == TPOT and
    sum(ITL) == E2E - TTFT, whatever the multi- and zero-token chunks in between."""
    ks = [1] + ks
    if ks[-1] == 0:
        ks[-1] = 1
    total, t, tr = 0, 100, []
    for i, k in enumerate(ks):
        total += k
        fin = "length" if i == len(ks) - 1 else None
        tr.append((t, ("data: " + _event_json(0, "x" * k, total, fin) + "\n\n").encode()))
        t += gaps[i]
    if stop_token:  # empty-text stop token with its own usage increment
        total += 1
        tr.append((t, ("data: " + _event_json(0, "", total, "stop") + "\n\n").encode()))
    tr.append((t + 1, b"data: [DONE]\n\n"))
    acc = run(tr)
    assert acc.success and acc.output_tokens == total
    itl = acc.itl_ms()
    e2e_ttft = (acc.last_token_ns - acc.first_token_ns) / MS
    if total >= 2:
        assert len(itl) == total - 1
        assert sum(itl) == pytest.approx(e2e_ttft)
        assert statistics.mean(itl) == pytest.approx(acc.tpot_ms())
    else:
        assert itl == [] and acc.tpot_ms() is None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [b"data: ", b"data:", b"{}", b'{"a":1}', b"\n", b"\r", b"x", b" ", b":c", b"event: e", "é".encode()]
        ),
        max_size=8,
    )
)
def test_simple_event_fast_path_agrees_with_feed(parts):
    """``simple_event`` returns data only for reads ``feed`` decodes to exactly that one event."""
    chunk = b"".join(parts) + b"\n\n"
    a, b = SSEDecoder(), SSEDecoder()
    a.feed(b"data: warm\n\n")  # past the stream start (BOM check)
    b.feed(b"data: warm\n\n")
    fast = a.simple_event(chunk)
    if fast is not None:
        evs = b.feed(chunk)
        assert [e.data for e in evs] == [fast.decode("utf-8", "replace")]
        assert evs[0].event == ""


# ----------------------------------------------------------------------------------------------
# B26 (client-faults-2.md): UTF-8 split across reads; invalid bytes counted, never fatal

B26_A = [
    (50, b'data: {"choices":[{"index":0,"text":"\xe4\xb8'),
    (52, b'\xad","finish_reason":null}]}\n\n'),
    (90, b'data: {"choices":[{"index":0,"text":"\xe6'),
    (
        91,
        b'\x96\x87","finish_reason":"length"}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}\n\ndata: [DONE]\n\n',
    ),
]
B26_B = [
    (10, b'data: {"choices":[{"index":0,"text":"\\u4e'),
    (11, b'2d","finish_reason":"length"}]}\n\ndata: [DONE]\n\n'),
]
B26_C = [(10, b'data: {"choices":[{"index":0,"text":"a\xffb","finish_reason":"length"}]}\n\ndata: [DONE]\n\n')]


def run_counting(transcript, splitter=None, *, simple: bool = False):
    """``run`` that also returns the invalid UTF-8 count of decoder + accumulator. ``simple``:
    hand a read that is one plain event over as bytes (``simple_event``), as the client does."""
    dec = SSEDecoder()
    acc = StreamAccumulator(keep_text=True)
    for ms, b in transcript:
        for piece in splitter(b) if splitter else [b]:
            data = dec.simple_event(piece) if simple else None
            if data is not None:
                acc.on_event(data, ms * MS)
                continue
            for ev in dec.feed(piece):
                acc.on_event(ev.data, ms * MS)
    dec.close()
    acc.finish()
    return acc, dec.invalid_utf8 + acc.invalid_utf8


def _reads(n):
    return None if n is None else (lambda b: [b[i : i + n] for i in range(0, len(b), n)])


@pytest.mark.parametrize("n", [1, 2, None], ids=["1-byte-reads", "2-byte-reads", "one-read-per-write"])
@pytest.mark.parametrize("simple", [False, True], ids=["feed", "simple_event"])
def test_b26_a_multibyte_characters_split_across_reads(n, simple):
    acc, invalid = run_counting(B26_A, _reads(n), simple=simple)
    m = metrics(acc)
    assert m["success"] and m["text"] == "中文" and len(m["text"]) == 2 and len(m["text"].encode()) == 6
    assert "\ufffd" not in m["text"] and invalid == 0
    assert m["N"] == 2 and m["completion"] == 2 and m["n_chunks"] == 2
    # each event's time is the arrival of its closing blank line: 52 and 91 ms
    assert m["ttft"] == 52 and m["e2e"] == 91 and m["tpot"] == 39


def test_b26_a_same_text_and_counts_for_every_split_of_the_whole_stream():
    whole = b"".join(b for _, b in B26_A)
    for name, chunks in splits_of(whole):
        acc, invalid = run_counting([(7, c) for c in chunks if c])
        assert (acc.success, acc.text, acc.output_tokens, acc.n_chunks, invalid) == (True, "中文", 2, 2, 0), name


@pytest.mark.parametrize("n", [1, 2, None], ids=["1-byte-reads", "2-byte-reads", "one-read-per-write"])
def test_b26_b_json_escape_split_across_reads(n):
    acc, invalid = run_counting(B26_B, _reads(n))
    assert acc.success and acc.text == "中" and invalid == 0


@pytest.mark.parametrize("n", [1, 2, None], ids=["1-byte-reads", "2-byte-reads", "one-read"])
def test_b26_c_invalid_byte_is_counted_never_fatal(n):
    acc, invalid = run_counting(B26_C, _reads(n))
    assert acc.success and acc.text == "a\ufffdb" and invalid == 1
    assert acc.finish_reason == "length" and acc.done_seen


def test_b26_c_invalid_byte_in_an_event_handed_over_as_bytes_and_in_a_whole_body():
    # the client's fast path hands a lone event over undecoded: the same rule holds there
    acc, invalid = run_counting([(10, B26_C[0][1].split(b"data: [DONE]")[0]), (11, b"data: [DONE]\n\n")], simple=True)
    assert acc.success and acc.text == "a\ufffdb" and invalid == 1
    body = StreamAccumulator(keep_text=True)
    body.on_body(b'{"choices":[{"index":0,"message":{"content":"a\xffb\xe4\xb8"},"finish_reason":"stop"}]}', 5 * MS)
    body.finish()
    assert body.success and body.text == "a\ufffdb\ufffd" and body.invalid_utf8 == 2


def test_b26_a_replacement_character_sent_by_the_server_is_not_an_error():
    tr = [(10, 'data: {"choices":[{"index":0,"text":"\ufffd","finish_reason":"length"}]}\n\ndata: [DONE]\n\n'.encode())]
    for simple in (False, True):
        acc, invalid = run_counting(tr, simple=simple)
        assert acc.success and acc.text == "\ufffd" and invalid == 0


def test_usage_only_at_the_end_with_multi_token_events_leaves_itl_unknown():
    # 2 text events, usage says 8 tokens: which event carried how many is not known -> no ITL
    acc = run(
        events_to_transcript(
            '{"choices":[{"text":"abcd"}]}',
            '{"choices":[{"text":"efgh","finish_reason":"length"}]}',
            '{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":8}}',
            "[DONE]",
        )
    )
    assert acc.success and acc.output_tokens == 8 and acc.tpot_ms() == 10 / 7 and acc.itl_ms() == []
