"""`replayer record` and `replayer trace from-log`: transparency, rows, privacy, bad input, drain.

The proxy runs as a real `replayer record` process in front of real servers on 127.0.0.1: the
fault server (byte transcripts, records what it received) or the embedded simulator.
"""

from __future__ import annotations

import glob
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import orjson
import pyarrow.parquet as pq
import pytest
from conftest import free_port, wait_http
from faultserver import Plan, ThreadedFaultServer
from prometheus_client.parser import text_string_to_metric_families
from test_capture_roundtrip import start_record, stop_record

from replayer.capture.blocks import BlockHasher, content_hash
from replayer.trace import read_trace

SECRET = "Bearer sk-SECRET-4711"


def sse(obj) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


CHUNK1 = sse({"choices": [{"index": 0, "text": " a", "finish_reason": None}]})
CHUNK2 = sse({"choices": [{"index": 0, "text": " b", "finish_reason": "length"}]})
USAGE = sse({"choices": [], "usage": {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}})


def plan(req) -> Plan:
    """Fault-server plan per request: a slow stream when asked, else a whole JSON body."""
    if isinstance(req, dict) and req.get("stream"):
        gap = 1500 if req.get("slow") else 0
        usage = [] if req.get("no_usage") else [(gap, USAGE)]
        return Plan(
            transcript=[(0, CHUNK1), (gap, CHUNK2), *usage, (gap, b"data: [DONE]\n\n")], headers={"X-Upstream": "yes"}
        )
    body = {
        "choices": [{"index": 0, "text": " x", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 6, "completion_tokens": 1, "total_tokens": 7},
    }
    return Plan(body=orjson.dumps(body), content_type="application/json", headers={"X-Upstream": "yes"})


def post(url: str, body: bytes | dict, headers: dict | None = None) -> tuple[int, dict, bytes]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def capture_rows(out) -> list[dict]:
    files = sorted(glob.glob(str(out / "trace-*.parquet"))) + sorted(glob.glob(str(out / "parts" / "*.parquet")))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


@pytest.fixture
def fault_capture(tmp_path):
    with ThreadedFaultServer(plan) as srv:
        out = tmp_path / "cap"
        p, url = start_record(out, srv.url, "--block-size", "4", "--flush-interval", "0.2")
        try:
            yield srv, out, url, p
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_stream_is_forwarded_as_it_arrives_and_the_row_has_the_usage(fault_capture):
    srv, out, url, p = fault_capture
    body = {"model": "m", "prompt": [5, 6, 7, 8, 9, 10], "max_tokens": 2, "stream": True, "slow": True}
    req = urllib.request.Request(
        url + "/v1/completions",
        data=orjson.dumps(body),
        headers={"Content-Type": "application/json", "X-Request-Id": "req-1"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["X-Upstream"] == "yes"
        first = r.fp.read1(65536) if hasattr(r.fp, "read1") else r.read(len(CHUNK1))
        got_first_ns = time.perf_counter_ns()
        rest = r.read()
    assert CHUNK1 in first
    # causal, not timed: the first chunk reached the client before the server wrote the second
    rec = srv.server.received[-1]
    assert got_first_ns < rec.write_start_ns[1]
    assert (first + rest).endswith(b"data: [DONE]\n\n")
    stop_record(p)
    rows = capture_rows(out)
    assert len(rows) == 1
    row = rows[0]
    assert row["request_id"] == "req-1" and row["endpoint"] == "/v1/completions" and row["model"] == "m"
    assert (row["input_length"], row["output_length"], row["max_tokens"], row["status"]) == (6, 2, 2, 200)
    assert row["input_length_source"] == "usage" and row["output_length_source"] == "usage"
    assert row["tokenized_by"] == "request" and row["hashed_tokens"] == 6
    assert row["hash_ids"] == [0, 1]  # one full block of 4, the partial last block its own id


def test_headers_both_ways_auth_forwarded_but_never_written(fault_capture):
    srv, out, url, p = fault_capture
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)  # (urllib sends its own Connection)
    conn.request(
        "POST",
        "/v1/completions?trace=1",
        body=orjson.dumps({"prompt": [1, 2, 3], "max_tokens": 1}),
        headers={
            "Content-Type": "application/json",
            "Authorization": SECRET,
            "X-Custom": "kept",
            "Connection": "keep-alive, X-Hop",
            "X-Hop": "dropped",
            "X-Session-Id": "sess-9",
        },
    )
    r = conn.getresponse()
    r.read()
    assert r.status == 200 and r.headers["X-Upstream"] == "yes"
    assert r.headers.get("Transfer-Encoding") is None or "chunked" in r.headers["Transfer-Encoding"]
    conn.close()
    rec = srv.server.received[-1]
    assert rec.headers["Authorization"] == SECRET and rec.headers["X-Custom"] == "kept"
    assert "X-Hop" not in rec.headers  # named by Connection: hop-by-hop
    assert rec.path == "/v1/completions?trace=1" or rec.path == "/v1/completions"
    stop_record(p)
    (row,) = capture_rows(out)
    assert row["session_id"] == "sess-9"
    for f in glob.glob(str(out / "**"), recursive=True):
        if os.path.isfile(f):
            data = open(f, "rb").read()
            assert b"SECRET-4711" not in data, f


def test_other_paths_pass_through_without_a_row_and_malformed_bodies_are_recorded(fault_capture):
    srv, out, url, p = fault_capture
    status, _, _ = post(url + "/v1/whatever", {"anything": 1})
    assert status == 200 and srv.server.received[-1].path.startswith("/v1/whatever")
    status, _, _ = post(url + "/v1/completions", b"{not json")
    assert status == 200
    assert srv.server.received[-1].body == b"{not json"  # passed through unchanged
    stop_record(p)
    (row,) = capture_rows(out)  # one row: the malformed request, recorded by its status
    assert row["status"] == 200 and row["hash_ids"] is None and row["tokenized_by"] == "none"


def test_sigterm_drains_a_request_in_flight(fault_capture):
    srv, out, url, p = fault_capture
    got: dict = {}

    def client():
        got["answer"] = post(
            url + "/v1/completions", {"prompt": [1, 2, 3, 4, 5], "stream": True, "slow": True, "max_tokens": 2}
        )

    t = threading.Thread(target=client)
    t.start()
    deadline = time.monotonic() + 60
    while not srv.server.received and time.monotonic() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    t.join(60)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert got["answer"][0] == 200 and got["answer"][2].endswith(b"data: [DONE]\n\n")
    (row,) = capture_rows(out)
    assert row["output_length"] == 2 and row["outcome"] == "ok"
    assert read_trace(out).input_length.tolist() == [6]  # the folder reads as a trace (usage: 6)


def test_metrics_and_healthz(fault_capture):
    srv, out, url, p = fault_capture
    post(url + "/v1/completions", {"prompt": [1, 2], "max_tokens": 1})
    admin = json.loads((out / "capture.json").read_text())["admin_port"]
    wait_http(f"http://127.0.0.1:{admin}/healthz")
    deadline = time.monotonic() + 30
    while True:
        text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10).read().decode()
        if "replayer_capture_rows_written_total 1.0" in text or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert 'replayer_capture_requests_total{endpoint="/v1/completions",outcome="ok",status="2xx"} 1.0' in text
    assert "replayer_capture_rows_written_total 1.0" in text
    assert 'replayer_capture_bytes_total{direction="request"}' in text
    assert "replayer_capture_tokenize_backlog" in text


def test_sigkill_leaves_readable_parts(fault_capture):
    srv, out, url, p = fault_capture
    for i in range(3):
        post(url + "/v1/completions", {"prompt": [i, 2, 3, 4, 5], "max_tokens": 1})
    deadline = time.monotonic() + 30
    while not glob.glob(str(out / "parts" / "part-*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # (a flush interval for the last rows)
    p.kill()
    p.wait()
    t = read_trace(out)
    assert len(t.input_length) == 3 and t.hash_ids_synthetic is False


def test_upstream_down_gives_502_and_a_row_and_keeps_serving(tmp_path):
    out = tmp_path / "cap"
    p, url = start_record(out, f"http://127.0.0.1:{free_port()}", "--flush-interval", "0.2")
    try:
        for _ in range(2):
            status, headers, body = post(
                url + "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            )
            assert status == 502 and "unreachable" in orjson.loads(body)["error"]["message"]
        admin = json.loads((out / "capture.json").read_text())["admin_port"]
        assert urllib.request.urlopen(f"http://127.0.0.1:{admin}/healthz", timeout=10).status == 200
    finally:
        stop_record(p)
    rows = capture_rows(out)
    assert [(r["status"], r["outcome"], r["input_length"]) for r in rows] == [(502, "upstream_unreachable", None)] * 2


def run_record(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "replayer", "record", *args], capture_output=True, text=True, timeout=120
    )


def test_unwritable_out_and_bad_tokenizer_are_refused_at_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = run_record("--upstream", "http://127.0.0.1:1", "--out", str(blocker / "cap"))
    assert r.returncode == 2 and "--out" in r.stderr and str(blocker / "cap") in r.stderr
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not a tokenizer")
    r = run_record("--upstream", "http://127.0.0.1:1", "--out", str(tmp_path / "c2"), "--tokenizer", str(bad))
    assert r.returncode == 2 and f"--tokenizer {bad}" in r.stderr


def test_chat_through_the_simulator_is_tokenized_by_its_tokenize_endpoint(tmp_path, sim_process):
    sim_url, _ = sim_process()
    out = tmp_path / "cap"
    p, url = start_record(out, sim_url, "--block-size", "4")
    system = "you are a helpful assistant who answers in short sentences always"
    for q, img in (("what is two plus two", "data:image/png;base64,AAAA"), ("what is three", None)):
        content = [{"type": "text", "text": q}]
        if img:
            content.append({"type": "image_url", "image_url": {"url": img}})
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": q}]
        status, _, body = post(
            url + "/v1/chat/completions", {"model": "sim-model", "messages": msgs, "max_tokens": 3, "user": "u7"}
        )
        assert status == 200, body
    stop_record(p)
    rows = sorted(capture_rows(out), key=lambda r: r["timestamp"])
    assert [r["tokenized_by"] for r in rows] == ["upstream", "upstream"]
    assert all(r["input_length"] == r["hashed_tokens"] and r["input_length_source"] == "usage" for r in rows)
    n_shared = len(system.split()) // 4  # full blocks of the shared system prompt
    assert rows[0]["hash_ids"][:n_shared] == rows[1]["hash_ids"][:n_shared]
    assert rows[0]["hash_ids"][n_shared:] != rows[1]["hash_ids"][n_shared:]
    assert rows[0]["session_id"] == "u7" and rows[0]["image_count"] == 0  # (images only in user parts sent)


def test_block_hashes_are_chained_keyed_and_partial_blocks_are_their_own():
    h = BlockHasher(b"k" * 32, 4)
    a = h.hash_ids([1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = h.hash_ids([1, 2, 3, 4, 5, 6, 7, 8])
    c = h.hash_ids([9, 9, 9, 9, 5, 6, 7, 8])
    assert a[:2] == b == [0, 1] and a[2] == 2
    assert c[1] != b[1]  # same tokens after a different prefix: another id (chained)
    d = h.hash_ids([1, 2, 3, 4, 5, 6])
    assert d[0] == 0 and d[1] not in (*a, *b, *c)  # a partial block never equals a full one
    other = BlockHasher(b"x" * 32, 4)
    assert other.digests([1, 2, 3, 4]) != h.digests([1, 2, 3, 4])  # keyed
    assert content_hash(b"k" * 32, "data:image/png;base64,AAAA") != content_hash(
        b"x" * 32, "data:image/png;base64,AAAA"
    )


def test_from_log_writes_the_same_rows_and_names_bad_lines(tmp_path):
    log = tmp_path / "gateway.jsonl"
    lines = [
        {
            "timestamp": 10.0,
            "endpoint": "/v1/completions",
            "request": {"model": "m", "prompt": list(range(1, 10)), "max_tokens": 4},
            "usage": {"prompt_tokens": 9, "completion_tokens": 4},
            "request_id": "a",
        },
        {
            "timestamp": 10.5,
            "endpoint": "/v1/completions",
            "request": {"prompt": list(range(1, 9)) + [50, 51], "user": "u1"},
            "response": {"usage": {"prompt_tokens": 10, "completion_tokens": 3}},
        },
    ]
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = tmp_path / "t.parquet"
    r = subprocess.run(
        [sys.executable, "-m", "replayer", "trace", "from-log", str(log), "-o", str(out), "--block-size", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    t = read_trace(out)
    assert t.input_length.tolist() == [9, 10] and t.output_length.tolist() == [4, 3]
    assert [t.hash_ids(i).tolist() for i in range(2)] == [[0, 1, 2], [0, 1, 3]]
    assert list(t.session_id) == [None, "u1"]
    log.write_text('{"timestamp": "yesterday", "request": {}}\n{"timestamp": 1}\n')
    r = subprocess.run(
        [sys.executable, "-m", "replayer", "trace", "from-log", str(log), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert f"{log}: line 1: timestamp:" in r.stderr and f"{log}: line 2: request:" in r.stderr


def _from_log(log, out, *extra):
    return subprocess.run(
        [sys.executable, "-m", "replayer", "trace", "from-log", str(log), "-o", str(out), "--block-size", "4", *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_from_log_reads_the_endpoint_from_the_body_and_says_why_rows_cannot_be_replayed(tmp_path):
    """Lines without an ``endpoint``: a token-id ``prompt`` is a completions request (it was taken
    for chat, nothing hashed, a trace of no replayable row written with exit 0). Every row that
    cannot be replayed is counted under its reason; a log with none replayable is exit 2."""
    log, out = tmp_path / "gateway.jsonl", tmp_path / "t.parquet"
    usage = {"prompt_tokens": 8, "completion_tokens": 4}
    ids = [{"timestamp": 1.0 + i, "request": {"prompt": [1, 2, 3, 4, 5, 6, 7, i]}, "usage": usage} for i in range(3)]
    log.write_text("\n".join(json.dumps(x) for x in ids) + "\n")
    r = _from_log(log, out)
    assert r.returncode == 0, r.stderr
    t = read_trace(out)
    assert len(t) == 3 and set(pq.read_table(out).column("endpoint").to_pylist()) == {"/v1/completions"}
    assert json.loads(r.stdout)["replayable"] == 3
    chat = {"timestamp": 5.0, "request": {"messages": [{"role": "user", "content": "hi"}]}, "usage": usage}
    no_usage = {"timestamp": 6.0, "request": {"prompt": [1, 2, 3]}}
    failed = {"timestamp": 7.0, "request": {"prompt": [1, 2, 3]}, "status": 500}
    log.write_text("\n".join(json.dumps(x) for x in [*ids, chat, no_usage, failed]) + "\n")
    r = _from_log(log, out)
    assert r.returncode == 0, r.stderr
    counts = json.loads(r.stdout)
    assert counts["replayable"] == 3 and counts["not_replayable"] == {
        "error_status": 1,
        "no_tokenizer": 1,
        "no_output_length": 1,
    }
    assert "3 of 6 rows cannot be replayed" in r.stderr and "1 a text prompt, and neither --tokenizer" in r.stderr
    assert len(read_trace(out)) == 3
    out.unlink()
    r = _from_log(log, out, "--endpoint", "/v1/chat/completions")  # ids where chat reads messages
    assert r.returncode == 2 and not out.exists()
    assert "4 the body has no prompt where its endpoint reads one" in r.stderr
    log.write_text(json.dumps(chat) + "\n")
    r = _from_log(log, out)
    assert r.returncode == 2 and not out.exists()
    assert "no row can be replayed" in r.stderr and "1 a text prompt, and neither --tokenizer" in r.stderr
    log.write_text(json.dumps({"timestamp": 1, "request": {"model": "m"}}) + "\n")
    r = _from_log(log, out)
    assert r.returncode == 2 and f"{log}: line 1: endpoint: missing" in r.stderr


def test_every_capture_metric_is_documented():
    from conftest import ROOT
    from prometheus_client import CollectorRegistry

    from replayer.capture.metrics import CaptureMetrics

    doc = (ROOT / "docs" / "capture.md").read_text()
    names = {
        m.name + ("_total" if m.type == "counter" else "")
        for m in CaptureMetrics(CollectorRegistry()).registry.collect()
        if m.name.startswith("replayer_capture")
    }
    assert len(names) == 9
    assert [n for n in names if f"`{n}`" not in doc] == []


def test_a_client_that_leaves_mid_stream_gives_a_row_with_the_output_reached(fault_capture):
    srv, out, url, p = fault_capture
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(
        "POST",
        "/v1/completions",
        body=orjson.dumps({"prompt": [1, 2, 3], "stream": True, "slow": True, "max_tokens": 2}),
        headers={"Content-Type": "application/json"},
    )
    r = conn.getresponse()
    assert CHUNK1 in r.read1(65536)
    conn.sock.close()  # the client goes away after the first chunk
    conn.close()
    deadline = time.monotonic() + 60
    while not capture_rows(out) and time.monotonic() < deadline:
        time.sleep(0.1)
    (row,) = capture_rows(out)
    assert row["outcome"] == "client_disconnected" and row["status"] == 200
    assert row["output_length"] >= 1  # what the upstream had sent when the client left
    stop_record(p)


def test_without_usage_the_lengths_are_counted_and_flagged(fault_capture):
    srv, out, url, p = fault_capture
    status, _, body = post(url + "/v1/completions", {"prompt": [1, 2, 3, 4, 5], "stream": True, "no_usage": True})
    assert status == 200 and b"usage" not in body
    stop_record(p)
    (row,) = capture_rows(out)
    assert (row["input_length"], row["input_length_source"]) == (5, "tokens")  # counted from the token ids
    assert (row["output_length"], row["output_length_source"]) == (2, "chunks")  # chunks with text: an estimate


def _forward_delay(admin: int) -> dict[str, tuple[float, float]]:
    """``replayer_capture_forward_delay_seconds`` by direction: (count, sum in seconds)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10).read().decode()
    fam = next(f for f in text_string_to_metric_families(text) if f.name == "replayer_capture_forward_delay_seconds")
    got = {s.labels["direction"]: {} for s in fam.samples}
    for s in fam.samples:
        got[s.labels["direction"]][s.name.rsplit("_", 1)[1]] = s.value
    return {d: (v["count"], v["sum"]) for d, v in got.items()}


def _stop(pid: int) -> int:
    """SIGSTOP ``pid`` and wait until it is stopped; returns the time it was seen stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "Tt":
        assert time.monotonic() < deadline, "the process did not stop"
        time.sleep(0.001)
    return time.perf_counter_ns()


def _cont(pid: int) -> int:
    """SIGCONT ``pid``; returns a time before it could run again."""
    t = time.perf_counter_ns()
    os.kill(pid, signal.SIGCONT)
    return t


@pytest.fixture
def stamped_capture(tmp_path):
    with ThreadedFaultServer(plan) as srv:
        out = tmp_path / "cap"
        p, url = start_record(out, srv.url, "--block-size", "4", "--stamp-responses")
        try:
            yield srv, out, url, p
        finally:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait()


def test_without_stamp_responses_only_requests_are_timed(fault_capture):
    srv, out, url, p = fault_capture
    admin = json.loads((out / "capture.json").read_text())["admin_port"]
    status, _, _ = post(url + "/v1/completions", {"prompt": [1, 2, 3], "stream": True, "max_tokens": 2})
    assert status == 200
    held = _forward_delay(admin)
    assert held["request"][0] == 1 and held["response"][0] == 0
    stop_record(p)


def test_the_time_the_proxy_holds_a_request_and_a_response_counts_from_the_kernels_arrival(stamped_capture):
    """The proxy is stopped (SIGSTOP) while a request reaches it and again while a response's
    event does: each is written on only after SIGCONT, so the forward delay it reports must count
    the whole stop, which it can only see from the kernel's arrival stamps (timed from its own read,
    it would report microseconds). Causal bounds only: arrival <= our send, write >= our SIGCONT."""
    srv, out, url, p = stamped_capture
    admin = json.loads((out / "capture.json").read_text())["admin_port"]
    wait_http(f"http://127.0.0.1:{admin}/healthz")
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.connect()
    _stop(p.pid)
    try:
        conn.request(
            "POST",
            "/v1/completions",
            body=orjson.dumps({"prompt": [1, 2, 3], "stream": True, "slow": True, "max_tokens": 2}),
            headers={"Content-Type": "application/json"},
        )
        sent = time.perf_counter_ns()  # the whole request is in the proxy's socket by now
        time.sleep(0.4)
    finally:
        resumed = _cont(p.pid)
    r = conn.getresponse()
    assert CHUNK1 in r.read1(65536)
    stopped = _stop(p.pid)  # the next event comes 1.5 s after the first: it waits in the socket
    try:
        time.sleep(2.5)
    finally:
        resumed2 = _cont(p.pid)
    assert r.read().endswith(b"data: [DONE]\n\n")
    conn.close()
    chunk2_in = srv.server.received[-1].write_ns[1]  # after the server's write of the second event
    held = _forward_delay(admin)
    slack = 0.001  # (the clocks' offset: sampled to ~20 us)
    assert held["request"][0] == 1
    assert held["request"][1] >= (resumed - sent) / 1e9 - slack
    assert held["response"][0] >= 2  # the head and first event, the second, ... (a read may carry several)
    if stopped < chunk2_in < resumed2:  # (else a host stall moved the event out of the stop: no bound)
        assert held["response"][1] >= (resumed2 - chunk2_in) / 1e9 - slack
    stop_record(p)
