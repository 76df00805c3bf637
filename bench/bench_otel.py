"""CPU cost of tracing on the event loop's thread: the traceparent line of a request's head
(built in the lead window) and the CLIENT span built from a result (the fan-out's step), per
request. The batch processor's thread (protobuf encoding, HTTP) is not counted here: the
fidelity benchmark's CPU per 1k requests counts the whole process.

    .venv/bin/python bench/bench_otel.py [N]

Spans go to an OTLP/HTTP receiver on 127.0.0.1 started here (tests/otlpreceiver.py), so the
exporter thread runs as it would in a run. Prints microseconds per request.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from otlpreceiver import Receiver  # noqa: E402

from replayer.core.result import RequestResult  # noqa: E402
from replayer.core.tracecontext import TraceContext  # noqa: E402
from replayer.observe.otel import RequestSpans  # noqa: E402


def main(n: int = 20_000) -> None:
    ids = TraceContext("bench", ratio=1.0)
    t = time.thread_time()
    for row in range(n):
        ids.header(0, row)
    header_us = (time.thread_time() - t) / n * 1e6
    results = [
        RequestResult(
            row=row,
            sent_ns=row * 1_000_000,
            first_token_ns=row * 1_000_000 + 50_000_000,
            last_token_ns=row * 1_000_000 + 900_000_000,
            end_ns=row * 1_000_000 + 900_100_000,
            outcome="success",
            prompt_tokens=1000,
            completion_tokens=200,
            max_tokens=200,
            finish_reason="length",
            ttft_ms=50.0,
            e2e_ms=900.1,
            dispatch_lag_ms=0.1,
            ttft_from_due_ms=50.1,
            e2el_from_due_ms=900.2,
            x_request_id=f"bench-0-{row}",
            expected_prefix_hit_tokens=512,
        )
        for row in range(n)
    ]
    with Receiver() as rx:
        spans = RequestSpans(
            rx.url + "/v1/traces",
            ids,
            shard=0,
            shard_text="0/1",
            model="m",
            target="http://127.0.0.1:8000",
            max_queue_size=n + 10,
        )
        spans.start(time.time_ns())
        p0, t = time.process_time(), time.thread_time()
        for res in results:
            spans.on_result(res)
        span_us = (time.thread_time() - t) / n * 1e6
        out = spans.close(timeout_s=30)
        # (the receiver runs in this process too: its decoding is counted here, an upper bound)
        all_us = (time.process_time() - p0) / n * 1e6
    print(
        f"traceparent line: {header_us:.2f} us/request; span from result: {span_us:.1f} us/request (this thread's CPU)"
    )
    print(f"everything (span, encoding, export, and the receiver's decoding): {all_us:.1f} us/request (process CPU)")
    print(f"exported {out['spans_exported']:,} of {out['spans_handed']:,}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
