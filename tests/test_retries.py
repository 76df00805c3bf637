"""Retry policy of the client (``retry_max``/``retry_backoff_s``), its metric, and the log output
(JSON lines, redaction, error-burst summaries): real Client -> real FaultServer on 127.0.0.1."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import math
import socket
import time

import pytest
from faultserver import DONE, FaultServer, Plan, choice, run_delay_ns, usage_event
from prometheus_client import CollectorRegistry
from test_client_faults import at, prepared, result_for

from replayer.core import ErrorKind, Outcome, RequestResult, now_ns
from replayer.core.result import SCHEMA, to_table
from replayer.http import Client
from replayer.http.measure import retry_after_s
from replayer.observe import ReplayerMetrics, setup_logging
from replayer.observe.logs import ErrorBurstLog, JsonFormatter

OK = Plan([(20, choice("a")), (25, choice("b", "length")), (26, usage_event(16, 2)), (27, DONE)])


def error(status: int, headers: dict | None = None) -> Plan:
    return Plan(
        status=status,
        content_type="application/json",
        headers=headers or {},
        body=json.dumps({"error": {"message": f"status {status}"}}).encode(),
    )


def run(plans, **client_kw) -> tuple[RequestResult, FaultServer]:
    async def main():
        async with FaultServer(plans) as srv:
            req = prepared(0)
            t0_ns, before = now_ns(), (now_ns(), run_delay_ns())
            async with Client(srv.url, t0_ns=t0_ns, **client_kw) as c:
                res = await asyncio.wait_for(c.send(req, result_for(req)), 20)
            if srv.received and res.sent_ns is not None:  # the last attempt, for test_client_faults.at
                last = srv.received[-1]
                last.client_sent_ns = t0_ns + res.sent_ns
                last.run_delays.insert(0, before)
                last.sample()
            return res, srv

    return asyncio.run(main())


def gaps_ms(srv: FaultServer) -> list[float]:
    t = [r.t0_ns for r in srv.received]
    return [(b - a) / 1e6 for a, b in zip(t, t[1:])]


def test_429_then_success_is_one_retry_measured_from_the_last_send():
    r, srv = run([error(429), OK], retry_max=3, retry_backoff_s=0.1)
    assert r.outcome == Outcome.SUCCESS.value and r.error_kind == "none" and r.error is None, r.error
    assert r.retries == 1 and r.http_status == 200 and len(srv.received) == 2
    assert gaps_ms(srv)[0] >= 95
    # TTFT from the last attempt's send (the transcript's first token is at +20 ms: against the
    # server's actual write), while the dispatch lag stays the first attempt's (sent at once:
    # due_ns = 0 = now), at least the 0.1 s backoff before the last send
    at(r.ttft_ms, srv.received[-1], 20)
    assert (r.sent_ns - r.due_ns) / 1e6 - r.dispatch_lag_ms >= 95 and (r.sent_ns - r.due_ns) / 1e6 >= 95
    assert r.first_token_ns - r.sent_ns == pytest.approx(r.ttft_ms * 1e6, abs=1)


def test_503_three_times_with_two_retries_fails_with_backoff_doubling():
    r, srv = run([error(503)] * 3 + [OK], retry_max=2, retry_backoff_s=0.05)
    assert r.outcome == Outcome.FAILED.value and r.error_kind == ErrorKind.HTTP_STATUS.value
    assert r.retries == 2 and r.http_status == 503 and "status 503" in r.error
    assert len(srv.received) == 3
    g = gaps_ms(srv)
    assert g[0] >= 45 and g[1] >= 95 and g[1] > g[0], g  # 0.05 s, then 0.1 s


def test_retry_after_seconds_is_honoured():
    r, srv = run([error(503, {"Retry-After": "1"}), OK], retry_max=1, retry_backoff_s=0.01)
    assert r.outcome == "success" and r.retries == 1
    g = gaps_ms(srv)[0]
    assert 950 <= g < 1600, g


def test_retry_after_parsing_and_cap():
    assert retry_after_s(None) == -1.0
    assert retry_after_s(b" 2 ") == 2.0
    assert retry_after_s(b"0") == 0.0
    assert retry_after_s(b"3600") == 60.0  # capped
    assert retry_after_s(b"Wed, 21 Oct 2015 07:28:00 GMT") == -1.0  # a date: the backoff applies
    assert retry_after_s(b"-5") == -1.0 and retry_after_s(b"nan") == -1.0


def test_no_retry_after_output_arrived():
    midstream = Plan([(5, choice("x")), (10, choice("y"))], close_at_ms=20)
    r, srv = run([midstream, OK], retry_max=3, retry_backoff_s=0.01)
    assert r.outcome == "failed" and r.error_kind == ErrorKind.DISCONNECT.value
    assert r.retries == 0 and len(srv.received) == 1 and r.n_chunks == 2
    # a 200 whose connection drops after the headers, before any event: not idempotent either
    r, srv = run([Plan([], close_at_ms=10), OK], retry_max=3, retry_backoff_s=0.01)
    assert r.error_kind == ErrorKind.DISCONNECT.value and r.retries == 0 and len(srv.received) == 1


@pytest.mark.parametrize("status", [400, 401, 404, 413])
def test_no_retry_on_4xx_other_than_429(status):
    r, srv = run([error(status), OK], retry_max=3, retry_backoff_s=0.01)
    assert r.outcome == "failed" and r.http_status == status and r.retries == 0 and len(srv.received) == 1


def test_retry_max_zero_never_retries():
    r, srv = run([error(503), OK])  # the default policy
    assert r.outcome == "failed" and r.http_status == 503 and r.retries == 0 and len(srv.received) == 1
    r, srv = run([error(429), OK], retry_max=0, retry_backoff_s=0.0)
    assert r.retries == 0 and len(srv.received) == 1


def test_disconnect_before_headers_is_retried():
    before_headers = Plan(body=b"", close_at_ms=0)  # RST before any response byte
    r, srv = run([before_headers, OK], retry_max=2, retry_backoff_s=0.01)
    assert r.outcome == "success" and r.retries == 1 and len(srv.received) == 2, (r.error_kind, r.error)


def test_connect_refused_is_retried_then_recorded():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens

    async def main():
        req = prepared(0)
        async with Client(f"http://127.0.0.1:{port}", t0_ns=now_ns(), retry_max=2, retry_backoff_s=0.02) as c:
            c.spare_target = 0
            t = now_ns()
            res = await c.send(req, result_for(req))
            return res, (now_ns() - t) / 1e6

    r, took_ms = asyncio.run(main())
    assert r.outcome == "failed" and r.error_kind == ErrorKind.CONNECT.value and r.retries == 2
    assert r.http_status is None and took_ms >= 55  # 0.02 + 0.04 s of backoff


def test_cancel_while_waiting_to_retry_is_recorded_and_propagates():
    async def main():
        async with FaultServer([error(503), OK]) as srv:
            req = prepared(0)
            res = result_for(req)
            async with Client(srv.url, t0_ns=now_ns(), retry_max=3, retry_backoff_s=5) as c:
                task = asyncio.ensure_future(c.send(req, res))
                await asyncio.sleep(0.3)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            return res

    r = asyncio.run(main())
    assert r.outcome == Outcome.CANCELLED.value and r.error_kind == "cancelled" and r.retries == 0


def test_retries_column_and_metric():
    r1, _ = run([error(429), OK], retry_max=3, retry_backoff_s=0.01)
    r2, _ = run([error(503)] * 3, retry_max=2, retry_backoff_s=0.01)
    r3, _ = run(OK)
    assert SCHEMA.field("retries").type == "int32"
    assert to_table([r1, r2, r3]).column("retries").to_pylist() == [1, 2, 0]
    reg = CollectorRegistry()
    m = ReplayerMetrics(reg, process_collector=False)
    assert reg.get_sample_value("replayer_request_retries_total") == 0
    for r in (r1, r2, r3):
        m.on_result(r)
    assert reg.get_sample_value("replayer_request_retries_total") == 3
    assert reg.get_sample_value("replayer_requests_total", {"outcome": "success", "error_kind": "none"}) == 2
    assert reg.get_sample_value("replayer_requests_total", {"outcome": "failed", "error_kind": "http_status"}) == 1


# ---- logs -----------------------------------------------------------------------------------


def test_json_formatter_one_object_per_line_with_extras_and_redaction():
    stream = io.StringIO()
    setup_logging("json", "debug", secrets=("sk-secret-1", None), stream=stream)
    try:
        lg = logging.getLogger("replayer.test")
        lg.info("hello %s\nworld sk-secret-1", "there", extra={"row": 7, "kind": "connect"})
        try:
            raise ValueError("boom")
        except ValueError:
            lg.exception("failed")
        lg.debug("obj %s", object(), extra={"weird": object()})
    finally:
        setup_logging("text", "warning", stream=io.StringIO())
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    objs = [json.loads(x) for x in lines]
    a = objs[0]
    assert a["level"] == "info" and a["logger"] == "replayer.test" and a["row"] == 7 and a["kind"] == "connect"
    assert a["msg"] == "hello there\nworld [redacted]" and a["ts"].endswith("Z") and "T" in a["ts"]
    assert "ValueError: boom" in objs[1]["exc"] and objs[1]["level"] == "error"
    assert "weird" in objs[2]
    assert "sk-secret-1" not in stream.getvalue()


def test_text_format_redacts_too():
    stream = io.StringIO()
    setup_logging("text", "info", secrets=("tok-123",), stream=stream)
    try:
        logging.getLogger("replayer.test").warning("token is tok-123")
    finally:
        setup_logging("text", "warning", stream=io.StringIO())
    assert "tok-123" not in stream.getvalue() and "token is [redacted]" in stream.getvalue()
    assert JsonFormatter().format(logging.makeLogRecord({"msg": "x"})).startswith("{")


def test_a_shards_log_lines_say_which_shard():
    for fmt in ("text", "json"):
        stream = io.StringIO()
        setup_logging(fmt, "info", stream=stream, fields={"shard": "1/4"})
        try:
            logging.getLogger("replayer.send.dispatcher").info("draining %d in-flight requests", 50)
        finally:
            setup_logging("text", "warning", stream=io.StringIO())
        line = stream.getvalue().strip()
        if fmt == "text":
            assert line.endswith(" INFO replayer.send.dispatcher[shard 1/4]: draining 50 in-flight requests")
        else:
            assert json.loads(line)["shard"] == "1/4"


def test_error_burst_log_is_one_start_line_then_one_line_per_window():
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    lg = logging.getLogger("replayer.test.bursts")
    lg.propagate = False
    lg.addHandler(Keep())
    lg.setLevel(logging.DEBUG)

    def failed(kind: str, i: int, status=None) -> RequestResult:
        return RequestResult(row=i, outcome="failed", error_kind=kind, http_status=status, error=f"err {i}")

    async def main():
        b = ErrorBurstLog(lg, window_s=0.3)
        start = time.perf_counter()
        for i in range(40):  # 40 failures over ~0.4 s: 2 windows
            b.observe(failed("http_status", i, 503))
            if i % 10 == 0:
                b.observe(failed("connect", i))
            b.observe(RequestResult(row=i, outcome="success"))
            await asyncio.sleep(0.01)
        feed_s = time.perf_counter() - start  # longer on a loaded machine: more windows
        await asyncio.sleep(0.8)  # the windows end; then one with none ends the burst
        b.observe(failed("http_status", 99, 500))  # a new burst
        b.observe(failed("http_status", 100, 500))
        b.close()
        return b, feed_s

    b, feed_s = asyncio.run(main())
    msgs = [r.getMessage() for r in records]
    http = [r for r in records if r.error_kind == "http_status"]
    assert http[0].getMessage().startswith("requests started failing with http_status (HTTP 503): err 0")
    summaries = [r for r in http if "in the last" in r.getMessage()]
    assert sum(r.failed for r in summaries) == 39 + 1  # all but the start lines, incl. close()
    assert all(r.getMessage().count("\n") == 0 for r in records)
    # the first burst's last window (however the feed fell into windows) names its last error
    first_burst = [
        m
        for m in msgs[: msgs.index(next(m for m in msgs if "no longer failing with http_status" in m))]
        if "failed with http_status in the last" in m
    ]
    assert "requests failed with http_status in the last 0.3 s; last error: err 39 (HTTP 503)" in first_burst[-1]
    assert any("no longer failing with http_status" in m for m in msgs)
    assert sum("started failing with http_status" in m for m in msgs) == 2
    assert sum("started failing with connect" in m for m in msgs) == 1
    # never one line per request: per kind a start line and one per window the feed spanned
    # (2 on a quiet machine: 10 lines in all), the end of the burst, and the second burst's 2
    windows = math.floor(feed_s / 0.3) + 1  # windows of 0.3 s opened while the feed ran
    assert len(records) <= 6 + 2 * windows and b.lines == len(records), (len(records), feed_s)
