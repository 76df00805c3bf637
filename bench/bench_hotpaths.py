"""Hot-path micro-benchmarks (issue 7): prints numbers, asserts nothing.

* building + serialising a 12k-token prompt body (warm block cache and cold),
* SSE decode + OpenAI chunk accounting per event (see also bench/bench_sse.py),
* per-request recording (Recorder.add, which builds Arrow batches on the loop; the writer thread
  only encodes Parquet) and metrics,
* the event loop's cost to hand a 70 KB request to the launcher process (shared ring or a memory
  file of its own), against a local server that reads everything,
* reading the full Mooncake conversation trace (``../shared/traces``, 12,031 rows of JSONL) with
  ``read_trace``, when it is present.

Run: ``.venv/bin/python bench/bench_hotpaths.py``. Numbers are CPU-bound and vary with what else
runs on the machine; each figure is the best of 5 repeats.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
from prometheus_client import CollectorRegistry

from replayer.core.result import RequestResult
from replayer.http.chunks import StreamAccumulator
from replayer.http.sse import SSEDecoder
from replayer.observe.metrics import ReplayerMetrics
from replayer.payload.body import PayloadBuilder
from replayer.payload.prompts import PromptBuilder
from replayer.record.recorder import Recorder


def best(fn, n: int, repeat: int = 5) -> float:
    """Best per-call time in microseconds over ``repeat`` runs of ``n`` calls."""
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn(n)
        out.append((time.perf_counter() - t) / n * 1e6)
    return min(out)


def bench_prompt() -> None:
    payload = PayloadBuilder("model")
    warm = PromptBuilder()
    ids = list(range(24))
    warm.prompt_json(ids, 12_000)

    def run_warm(n):
        for _ in range(n):
            payload.body(warm.prompt_json(ids, 12_000), 300)

    counter = iter(range(10**9))

    def run_cold(n):
        p = PromptBuilder()
        for _ in range(n):
            k = next(counter) * 24
            payload.body(p.prompt_json(list(range(k, k + 24)), 12_000), 300)

    print(f"prompt body 12k tokens, warm block cache : {best(run_warm, 2000):8.1f} us")
    print(f"prompt body 12k tokens, cold (24 new blocks): {best(run_cold, 200):8.1f} us")
    print(f"prompt body bytes: {len(payload.body(warm.prompt_json(ids, 12_000), 300)):,}")


def _stream(n_tokens: int) -> list[bytes]:
    chunks = [
        b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
        b'"text":" tok","logprobs":null,"finish_reason":null}]}\n\n'
        for _ in range(n_tokens - 1)
    ]
    chunks.append(
        b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
        b'"text":" tok","logprobs":null,"finish_reason":"length"}]}\n\n'
    )
    chunks.append(
        b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],'
        b'"usage":{"prompt_tokens":12000,"completion_tokens":%d,"total_tokens":1}}\n\ndata: [DONE]\n\n' % n_tokens
    )
    return chunks


def bench_sse() -> None:
    chunks = _stream(500)

    def run(n):
        for _ in range(n):
            dec, acc = SSEDecoder(), StreamAccumulator()
            t = 0
            for c in chunks:
                t += 1000
                for ev in dec.feed(c):
                    acc.on_event(ev.data, t)
            acc.finish()
            acc.itl_ms()

    per_req = best(run, 20)
    print(
        f"SSE decode + accounting, per event        : {per_req / len(chunks):8.2f} us "
        f"({per_req / 1000:.2f} ms per 500-token request incl. ITL)"
    )


def bench_client_protocol() -> None:
    """The client's per-chunk path without sockets: HTTP/1.1 chunked frames fed to the connection
    protocol (llhttp parse -> SSE fast path -> OpenAI chunk accounting), as uvloop would."""
    import asyncio

    from replayer.http.client import Client
    from replayer.http.connection import Connection, Exchange

    class NullTransport:
        def write(self, b):
            pass

        def get_extra_info(self, name):
            return None

        def abort(self):
            pass

    ev = (
        b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
        b'"text":" the","logprobs":null,"finish_reason":null}]}\n\n'
    )
    frame = b"%x\r\n" % len(ev) + ev + b"\r\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

    async def main() -> float:
        loop = asyncio.get_running_loop()
        c = Client("http://127.0.0.1:1", t0_ns=0)
        best = 1e9
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(40):
                conn = Connection(c)
                conn.connection_made(NullTransport())
                ex = Exchange(loop.create_future(), None)
                conn.start(b"x", ex)
                conn.data_received(head)
                for _ in range(500):
                    conn.data_received(frame)
                ex.acc.finish()
                ex.acc.itl_ms()
            best = min(best, (time.perf_counter() - t) / (40 * 500) * 1e6)
        return best

    print(f"client per chunk (llhttp + SSE + accounting): {asyncio.run(main()):8.2f} us")


def bench_record() -> None:
    reg = CollectorRegistry()
    m = ReplayerMetrics(reg)
    itl = [10.0] * 300

    def make(i):
        return RequestResult(
            row=i,
            input_length=12000,
            output_length=300,
            prompt_len_sent=12000,
            max_tokens=300,
            due_ns=i,
            sent_ns=i,
            first_token_ns=i + 10,
            last_token_ns=i + 20,
            end_ns=i + 21,
            outcome="success",
            prompt_tokens=12000,
            completion_tokens=300,
            usage_source="server",
            n_chunks=300,
            finish_reason="length",
            ttft_ms=50.0,
            e2e_ms=3000.0,
            tpot_ms=10.0,
            dispatch_lag_ms=0.1,
            itl_ms=itl,
        )

    with tempfile.TemporaryDirectory() as d:
        rec = Recorder(os.path.join(d, "r.parquet"), flush_rows=2000)
        results = [make(i) for i in range(20_000)]
        it = iter(results)

        def run_add(n):
            for _ in range(n):
                rec.add(next(it))

        add_us = best(run_add, 2000, repeat=5)
        t = time.perf_counter()
        rec.close()
        close_s = time.perf_counter() - t
    print(f"recorder add (event loop side, Arrow batches of 128 built there): {add_us:8.2f} us per request")
    print(f"recorder final flush of the rest           : {close_s * 1e3:8.1f} ms")

    from replayer.core.result import Rows

    rows, worst = Rows(), 0.0
    for r in results[:2000]:
        t = time.perf_counter()
        rows.add(r)
        worst = max(worst, time.perf_counter() - t)
    print(f"longest single add (closes a 128-row batch): {worst * 1e3:8.2f} ms")

    def run_metrics(n):
        r = make(0)
        for _ in range(n):
            m.on_result(r)

    print(f"metrics.on_result (300 ITL samples)        : {best(run_metrics, 2000):8.1f} us per request")
    bench_run_series(make)


def bench_run_series(make) -> None:
    """Issue 46's per-request additions (the live window's step) and the scrape of the run's
    series (fine buckets, the run id on every sample), after 3,000 requests of 300 tokens."""
    from prometheus_client import generate_latest

    from replayer.observe.histograms import COARSE_LATENCY_BUCKETS, LATENCY_BUCKETS, BatchedHistogram
    from replayer.observe.runlabels import RunLabels

    reg = CollectorRegistry()
    m = ReplayerMetrics(reg)
    r = make(0)

    def run_window(n):
        for _ in range(n):
            m.live_window.on_result(r)

    print(f"live window on_result (300 ITL samples)    : {best(run_window, 2000):8.1f} us per request")
    for name, buckets in (("fine", LATENCY_BUCKETS), ("coarse", COARSE_LATENCY_BUCKETS)):
        h = BatchedHistogram("x", "x", buckets, None)

        def run_add(n, h=h):
            for i in range(n):
                h.add(0.001 * (i % 5000))

        print(f"one histogram add, {name:6} ({len(buckets):3} buckets)   : {best(run_add, 20_000):8.2f} us")
    reg = CollectorRegistry()
    m = ReplayerMetrics(reg)
    for _ in range(3000):
        m.on_result(r)
        m.live_window.on_result(r)
    exposed = RunLabels(reg, {"run_id": "bench"})
    lines = generate_latest(exposed).count(b"\n")
    print(
        f"scrape after 3,000 requests ({lines} lines)   : {best(lambda n: [generate_latest(exposed) for _ in range(n)], 3) / 1e3:8.1f} ms"
    )


def bench_handover() -> None:
    """Loop time of ``Launcher.submit`` for a 12k-token request (~70 KB), each due 2 ms after
    its hand-over, as the dispatcher hands them over; 400 per mode, to 127.0.0.1."""
    import asyncio
    import socket

    from replayer.core.clock import now_ns
    from replayer.http.launcher import Launcher

    class Drain(asyncio.Protocol):
        def data_received(self, data):
            pass

    async def one(ring_bytes: int) -> tuple[float, float, int]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Drain, "127.0.0.1", 0)
        socks = [socket.create_connection(("127.0.0.1", server.sockets[0].getsockname()[1])) for _ in range(8)]
        launcher = Launcher(priority="default", ring_bytes=ring_bytes)
        launcher.start()
        await launcher.ready()
        launcher.attach(lambda *a: None)
        head, body = b"POST /v1/completions HTTP/1.1\r\n" + b"X: y\r\n" * 6 + b"\r\n", os.urandom(70_000)
        took = []
        try:
            for i in range(400):
                t = now_ns()
                launcher.submit(t + 2_000_000, socks[i % 8].fileno(), head, body)
                took.append(now_ns() - t)
                await asyncio.sleep(0.0025)
            while launcher.pending():
                await asyncio.sleep(0.01)
            return float(np.median(took)) / 1e3, float(np.percentile(took, 99)) / 1e3, launcher.ring_misses
        finally:
            launcher.stop()
            for s in socks:
                s.close()
            server.close()

    for name, ring in (("shared ring", 4 << 20), ("memory file each", 1024)):
        p50, p99, misses = asyncio.run(one(ring))
        print(f"launcher hand-over 70 KB, {name:16s}: {p50:8.1f} us p50, {p99:6.1f} us p99 (ring misses {misses})")


def bench_trace_read() -> None:
    from pathlib import Path

    from replayer.trace import read_trace

    path = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation.jsonl"
    if not path.exists():
        print(f"trace read: {path} not present, skipped")
        return
    read_trace(path)  # warm imports and the page cache
    secs = best(lambda n: [read_trace(path) for _ in range(n)], 1) / 1e6
    print(f"read_trace full Mooncake JSONL (12,031 rows): {secs * 1e3:8.1f} ms")


if __name__ == "__main__":
    bench_handover()
    bench_prompt()
    bench_sse()
    bench_client_protocol()
    bench_record()
    bench_trace_read()
