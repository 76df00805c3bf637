"""Timeouts told apart (shared/cases/client-faults-2.md B27): an idle (between-bytes) read timeout
apart from an optional total timeout, a kind per timeout (connect, first byte, idle, total) and
for a reused keep-alive connection closed before any response byte, a non-empty message on every
failure, and the partial output of a failed request kept apart from every total and statistic.

Real ``replayer.http.client.Client`` against the transcript-playing aiohttp server on 127.0.0.1
(``tests/faultserver.py``). Times are asserted with generous tolerances (a loaded 2-core machine);
counts, kinds and tokens exactly."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from dataclasses import dataclass

import pyarrow.parquet as pq
import pytest
from conftest import replay_against
from faultserver import DONE, FaultServer, Plan, ProcessFaultServer, choice, run_delay_ns, usage_event
from test_client_faults import (
    PROMPTS,
    SANITY_MS,
    TOL_MS as TOL_FAULTS_MS,
    by_prompt_head,
    play,
    prepared,
    result_for,
    send_all,
    served,
)

from replayer.core import ErrorKind, now_ns
from replayer.core.result import to_table
from replayer.http import Client
from replayer.results import summarize

TOL_MS = 60.0  # generous: a loaded machine; every B27 boundary is >= 50 ms from the next event

# ---- B27's transcripts, exactly as the case gives them --------------------------------------
tok = b'data: {"choices":[{"index":0,"text":"t","finish_reason":null}]}\n\n'
last = b'data: {"choices":[{"index":0,"text":"t","finish_reason":"length"}]}\n\n'
R1 = [(100 * i, tok) for i in range(1, 30)] + [
    (3000, last),
    (3001, b'data: {"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":30,"total_tokens":38}}\n\n'),
    (3002, b"data: [DONE]\n\n"),
]
HOLD_MS = 20_000  # R2's connection stays open this long, silent (the client gives up first)
R2 = [(50, tok), (HOLD_MS, b"")]  # then nothing more; the connection stays open
R3 = [(40 * i, tok) for i in range(1, 5)] + [
    (200, last),
    (201, b'data: {"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":5,"total_tokens":13}}\n\n'),
    (202, b"data: [DONE]\n\n"),
]


class _ByHead:
    """Picklable plan chooser (for the server's own process): the plan of row k of ``prepared``."""

    def __init__(self, plans: dict[int, Plan]) -> None:
        self.plans = {int(PROMPTS.block_ids(k)[0]): p for k, p in plans.items()}

    def __call__(self, body):
        return self.plans[body["prompt"][0]]


def b27(**client_kw):
    """R1, R2, R3 sent at t = 0 through one Client -> (results in that order, run seconds). The
    server runs in its own process, like a real target: its writes reach the socket on time even
    when the client's loop is busy, and the client reads what arrived before its timers fire."""
    res, run_s, _ = b27_seen(**client_kw)
    return res, run_s


def b27_seen(**client_kw):
    """``b27`` -> (results, run seconds, ``Seen``: what the server actually did, to check the
    client's times against)."""
    reqs = [prepared(1), prepared(2), prepared(3)]
    with ProcessFaultServer(_ByHead({1: Plan(R1), 2: Plan(R2), 3: Plan(R3)})) as srv:
        t = now_ns()
        res, samples = asyncio.run(_sampled(send_all(srv.url, reqs, t, **client_kw)))
        run_s = (now_ns() - t) / 1e9
    return res, run_s, Seen(t, {r.row: served(srv, q) for r, q in zip(res, reqs)}, samples)


async def _sampled(coro):
    """Run ``coro`` (60 s at most) beside a probe that samples the loop thread's run-queue wait
    every 5 ms -> (its result, [(perf_counter_ns, run_delay_ns()), ...])."""
    samples = [(now_ns(), run_delay_ns())]

    async def probe():
        while True:
            await asyncio.sleep(0.005)
            d = run_delay_ns()
            samples.append((now_ns(), d))

    task = asyncio.create_task(probe())
    try:
        return await asyncio.wait_for(coro, 60), samples
    finally:
        task.cancel()
        samples.append((now_ns() + 1, run_delay_ns()))


@dataclass
class Seen:
    """The client's anchor (``t0_ns``), the server's record of each row's request and samples
    of the client thread's run-queue wait (the time the machine kept it off the CPU)."""

    t0_ns: int
    recs: dict
    samples: list

    def off_cpu_ms(self, start_ns: int, end_ns: int) -> float:
        """The client thread's run-queue wait over a window covering ``start_ns``..``end_ns``."""
        before = [d for t, d in self.samples if t <= start_ns] or [0]
        after = [d for t, d in self.samples if t >= end_ns] or [self.samples[-1][1]]
        return (min(after) - max(before)) / 1e6

    def at(self, r, field: str, ms: float) -> None:
        """The client's stamp ``r.<field>`` (first_token_ns, last_token_ns) against the server's
        actual write of the item planned at ``ms`` (same clock): never before it, at most
        ``test_client_faults.TOL_MS`` after it plus the client's time off the CPU; the planned
        ``ms`` (the case's value) is a sanity bound only."""
        rec = self.recs[r.row]
        stamp_ns, wrote_ns = self.t0_ns + getattr(r, field), rec.wrote_ns(ms)
        err, off_cpu = (stamp_ns - wrote_ns) / 1e6, self.off_cpu_ms(wrote_ns, stamp_ns)
        assert 0 <= err <= TOL_FAULTS_MS + off_cpu, (field, ms, err, off_cpu)
        assert self.t0_ns + r.sent_ns < rec.t0_ns  # sent before the server had it
        assert ms <= (stamp_ns - self.t0_ns - r.sent_ns) / 1e6 <= ms + SANITY_MS

    def gap(self, r, a_ms: float, b_ms: float, n: int) -> None:
        """The client's TPOT ``r.tpot_ms`` against the server's actual writes of the items
        planned at ``a_ms`` and ``b_ms``, over ``n`` intervals: each end's stamp within
        ``test_client_faults.TOL_MS`` plus the client's time off the CPU (see ``at``); the
        planned interval is a sanity bound only."""
        rec = self.recs[r.row]
        actual = (rec.wrote_ns(b_ms) - rec.wrote_ns(a_ms)) / 1e6 / n
        off_cpu = self.off_cpu_ms(rec.wrote_ns(a_ms), self.t0_ns + r.last_token_ns)
        assert abs(r.tpot_ms - actual) <= (TOL_FAULTS_MS + off_cpu) / n, (r.tpot_ms, actual, off_cpu)
        assert abs(r.tpot_ms - (b_ms - a_ms) / n) <= SANITY_MS / n, r.tpot_ms

    def ended_by(self, r, start_ns: int, ms: float) -> None:
        """``r`` failed on a timer of ``ms`` started at ``start_ns`` (perf_counter_ns): not before
        it, and at most ``3 * TOL_MS`` after it plus the client's time off the CPU meanwhile (a
        late timer on a busy machine is not a wrong timeout)."""
        end_ns = self.t0_ns + r.end_ns
        late_ms = (end_ns - start_ns) / 1e6 - ms
        assert -2 <= late_ms <= 3 * TOL_MS + self.off_cpu_ms(start_ns, end_ns), (late_ms, ms)


def took_ms(r) -> float:
    return (r.end_ns - r.sent_ns) / 1e6


def test_b27_a_silent_stream_fails_as_idle_timeout_and_a_slow_steady_one_is_never_cut():
    (r1, r2, r3), run_s, seen = b27_seen(read_timeout_s=0.5)  # no total timeout (the default)
    # R1: 30 tokens 100 ms apart, never 500 ms silent: success
    assert r1.outcome == "success", (r1.error_kind, r1.error)
    seen.at(r1, "first_token_ns", 100)  # TTFT and E2E against the server's actual writes
    seen.at(r1, "last_token_ns", 3000)
    assert r1.completion_tokens == 30
    seen.gap(r1, 100, 3000, 29)
    assert r1.partial_output_tokens is None
    # R2: failed 500 ms after its last byte (50 ms), as an idle timeout with a message
    assert r2.outcome == "failed" and r2.error_kind == ErrorKind.IDLE_TIMEOUT.value
    assert took_ms(r2) >= 548, took_ms(r2)
    seen.ended_by(r2, seen.recs[r2.row].wrote_ns(50), 500)  # 500 ms after the server wrote its byte
    assert "idle timeout" in r2.error and "--read-timeout 0.5 s" in r2.error
    assert r2.partial_output_tokens == 1 and r2.completion_tokens is None  # kept apart
    # R3: success
    assert r3.outcome == "success", (r3.error_kind, r3.error)
    seen.at(r3, "first_token_ns", 40)
    seen.at(r3, "last_token_ns", 200)
    assert r3.completion_tokens == 5
    seen.gap(r3, 40, 200, 4)
    # the run ends with R1 (~3 s), not with R2's held connection
    assert run_s < HOLD_MS / 1e3 / 2
    s = summarize(to_table([r1, r2, r3]))
    assert (s["completed"], s["failed"], s["errors_by_kind"]) == (2, 1, {"idle_timeout": 1})
    assert s["total_output_tokens"] == 35 and s["partial_output_tokens"] == 1  # R2's: kept apart
    assert s["mean_ttft_ms"] == pytest.approx((r1.ttft_ms + r3.ttft_ms) / 2)  # R1 and R3 only
    assert s["mean_e2el_ms"] == pytest.approx((r1.e2e_ms + r3.e2e_ms) / 2)
    assert s["mean_tpot_ms"] == pytest.approx((r1.tpot_ms + r3.tpot_ms) / 2)  # ~70


def test_b27_a_total_timeout_cuts_the_long_stream_and_keeps_its_partial_tokens():
    (r1, r2, r3), _, seen = b27_seen(read_timeout_s=0.5, request_timeout_s=1.95)
    assert r1.outcome == "failed" and r1.error_kind == ErrorKind.TOTAL_TIMEOUT.value
    assert took_ms(r1) >= 1949, took_ms(r1)
    seen.ended_by(r1, seen.t0_ns + r1.sent_ns, 1950)
    assert "total timeout" in r1.error and "1.95 s" in r1.error and "--request-timeout" in r1.error
    # its partial tokens: the 19 the server writes before 1950 ms, as many as it actually wrote
    # before the cut on a loaded machine (the last of them may still be unread at the cut)
    cut_ns = seen.t0_ns + r1.end_ns
    written = sum(t < cut_ns for t in seen.recs[r1.row].write_start_ns)
    assert r1.partial_output_tokens in (written, written - 1), (r1.partial_output_tokens, written)
    assert 19 - 5 <= r1.partial_output_tokens <= 19 + 5  # sanity: the case's 19
    assert r1.completion_tokens is None and r1.usage_source == "none"
    assert r2.error_kind == ErrorKind.IDLE_TIMEOUT.value  # the idle timeout still applies
    assert r3.outcome == "success" and r3.completion_tokens == 5
    s = summarize(to_table([r1, r2, r3]))
    assert s["errors_by_kind"] == {"idle_timeout": 1, "total_timeout": 1}
    assert s["completed"] == 1 and s["total_output_tokens"] == 5 and s["mean_ttft_ms"] == r3.ttft_ms
    seen.at(r3, "first_token_ns", 40)
    assert s["partial_output_tokens"] == r1.partial_output_tokens + 1


def test_no_response_byte_within_the_read_timeout_is_a_first_byte_timeout():
    [r], srv = play(Plan([(2000, choice("a", "length"))], headers_delay_ms=2000), read_timeout_s=0.3)
    assert r.outcome == "failed" and r.error_kind == ErrorKind.FIRST_BYTE_TIMEOUT.value
    assert "first-byte timeout" in r.error and r.http_status is None and r.partial_output_tokens is None
    # 300 ms after the send; later only by the time the machine kept the (one) loop thread off the
    # CPU meanwhile
    rec = served(srv)
    off_cpu = rec.off_cpu_ms(rec.client_sent_ns, rec.client_sent_ns + round(took_ms(r) * 1e6))
    assert 299 <= took_ms(r) <= 300 + 3 * TOL_MS + off_cpu, (took_ms(r), off_cpu)


def test_a_connection_not_accepted_in_time_is_a_connect_timeout():
    # a listener that never accepts, its backlog full: the kernel drops further SYNs
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen(0)
        port = lst.getsockname()[1]
        fillers = []
        try:
            for _ in range(8):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
                fillers.append(s)

            async def main():
                async with Client(f"http://127.0.0.1:{port}", t0_ns=now_ns(), connect_timeout_s=0.3) as c:
                    c.pool.spare_target = 0
                    req = prepared(0)
                    return await asyncio.wait_for(c.send(req, result_for(req)), 30)

            r = asyncio.run(main())
        finally:
            for s in fillers:
                s.close()
    assert r.outcome == "failed" and r.error_kind == ErrorKind.CONNECT_TIMEOUT.value, (r.error_kind, r.error)
    assert "connect timeout" in r.error and "0.3 s" in r.error


OK_STREAM = [(10, choice("a", "length")), (11, usage_event(3, 1)), (12, DONE)]


async def _one_after_another(url: str, n: int, **client_kw):
    async with Client(url, t0_ns=now_ns(), **client_kw) as c:
        c.pool.spare_target = 0  # one connection, reused
        out = []
        for i in range(n):
            req = prepared(i)
            out.append(await c.send(req, result_for(req)))
        return out


@pytest.mark.parametrize("retry_max", [0, 1])
def test_a_reused_connection_closed_before_any_byte_is_its_own_kind_and_retried_by_the_policy(retry_max):
    plans = [Plan(OK_STREAM), Plan(close_at_ms=0, body=b""), Plan(OK_STREAM)]

    async def main():
        async with FaultServer(plans) as srv:
            return await asyncio.wait_for(
                _one_after_another(srv.url, 2, retry_max=retry_max, retry_backoff_s=0.01), 30
            ), srv

    (a, b), srv = asyncio.run(main())
    assert a.outcome == "success"
    if retry_max:  # no response byte came back: re-sent (counted), and the new answer is the result
        assert b.outcome == "success" and b.retries == 1 and len(srv.received) == 3
    else:
        assert b.outcome == "failed" and b.error_kind == ErrorKind.STALE_CONNECTION.value
        assert "reused keep-alive connection closed before any response byte" in b.error
        assert b.retries == 0 and len(srv.received) == 2


def test_a_new_connection_closed_before_any_byte_stays_a_disconnect():
    [r], _ = play(Plan(close_at_ms=0, body=b""))
    assert r.outcome == "failed" and r.error_kind == ErrorKind.DISCONNECT.value and r.error


def test_every_failure_has_a_kind_and_a_non_empty_message():
    plans = by_prompt_head(
        {
            0: Plan(R2),  # idle timeout
            1: Plan(status=500, body=b"", content_type="application/json"),  # HTTP error, empty body
            2: Plan([(10, choice("a"))], close_at_ms=20),  # disconnect mid-stream
            3: Plan([(10, b"data: not json\n\n"), (11, DONE)]),  # protocol
            4: Plan([(10, choice("a"))]),  # incomplete
            5: Plan([(10, b'data: {"error": {}}\n\n'), (11, DONE)]),  # stream error without a message
        }
    )
    res, _ = play(plans, [prepared(i) for i in range(6)], read_timeout_s=0.3)
    assert [r.outcome for r in res] == ["failed"] * 6
    assert all(r.error_kind != "none" and r.error and r.error.strip() for r in res), [
        (r.error_kind, r.error) for r in res
    ]


def test_request_timeout_flag_reaches_the_client(tmp_path, sim_process):
    # the embedded simulator streams 64 tokens 20 ms apart (~1.3 s): a 0.4 s total timeout cuts
    # each one, and the summary counts them by kind
    url, _ = sim_process("--itl-base-ms", "20", "--itl-per-running-us", "0")
    rows = [{"timestamp": 10 * i, "input_length": 16, "output_length": 64, "hash_ids": [i]} for i in range(3)]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = tmp_path / "res"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace),
            "--target",
            url,
            "--results",
            str(res),
            "--admin-port",
            "0",
            "--quiet",
            "--request-timeout",
            "0.4",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 3, p.stderr[-3000:]  # (every request cut: the run measured nothing, issue 47)
    summary = json.loads((res / "summary.json").read_text())
    assert summary["errors_by_kind"] == {"total_timeout": 3} and summary["total_output_tokens"] == 0
    got = pq.read_table(res / "requests.parquet").to_pylist()
    assert all(r["partial_output_tokens"] and r["partial_output_tokens"] < 64 for r in got), got


def test_b27_a_whole_run_ends_with_the_long_stream_and_writes_its_results(tmp_path):
    # the case end to end through `replayer run`: three rows at t = 0 whose prompts start with the
    # blocks of ids 1, 2, 3 (the server plays R1, R2, R3 by the prompt's first token id)
    rows = [
        {"timestamp": 0, "input_length": 16, "output_length": 30 if k == 1 else 5, "hash_ids": [k]} for k in (1, 2, 3)
    ]
    trace = tmp_path / "b27.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = tmp_path / "res"
    with ProcessFaultServer(_ByHead({1: Plan(R1), 2: Plan(R2), 3: Plan(R3)})) as srv:
        p = replay_against(trace, srv.url, res, "--block-size", "16", "--read-timeout", "0.5", model=None, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((res / "summary.json").read_text())
    assert (s["completed"], s["failed"], s["errors_by_kind"]) == (2, 1, {"idle_timeout": 1})
    assert s["total_output_tokens"] == 35 and s["partial_output_tokens"] == 1
    assert 3.0 <= s["duration"] < HOLD_MS / 1e3 / 2  # R1's 3 s, never R2's held connection
    got = sorted(pq.read_table(res / "requests.parquet").to_pylist(), key=lambda r: r["row"])
    assert [r["outcome"] for r in got] == ["success", "failed", "success"]
    assert got[1]["partial_output_tokens"] == 1 and got[1]["completion_tokens"] is None and got[1]["error"]


def test_the_read_timeout_of_a_request_handed_to_the_launcher_counts_from_its_write():
    # the dispatcher hands a request to the launcher process ahead of its due time; silence before
    # the write is not the server's (here the hand-over is longer ahead than the read timeout)
    from replayer.http.launcher import Launcher

    async def main():
        async with FaultServer(Plan(OK_STREAM, headers_delay_ms=50)) as srv:
            launcher = Launcher(priority="default")
            try:
                # the server's first byte 50 ms after the write, 450 ms inside the read timeout
                # (a loaded machine answered 211 ms late); handed over 1 s ahead: more than it
                async with Client(srv.url, t0_ns=now_ns(), read_timeout_s=0.5) as c:
                    launcher.start()
                    await launcher.ready()
                    c.use_launcher(launcher)
                    await c.warm_up(1)
                    req = prepared(0)
                    res = req.new_result(0)
                    reserved = c.reserve(req, res)
                    assert reserved is not None
                    c.launch(now_ns() + 1_000_000_000, req, res, reserved)  # written 1 s from now
                    return await asyncio.wait_for(c.send(req, res, reserved), 30), launcher.launched
            finally:
                launcher.stop()

    r, launched = asyncio.run(main())
    assert launched == 1
    assert r.outcome == "success", (r.error_kind, r.error)  # not failed before it was even written
