"""Micro-benchmark of replayer.http.sse and replayer.http.chunks on a realistic vLLM /v1/completions stream.

Prints microseconds per SSE event for: decoder + accumulator (plain stream, and with
continuous_usage_stats), the decoder alone, and the decoder on a CRLF stream (general path).
The stream is 500 token events + a usage-only event + [DONE], delivered in reads of 1-3 events
(as vLLM's per-step flushes arrive over TCP), plus a variant where reads split events at random
byte positions. Times are process CPU time (robust to other load on the machine), best of 5.
No assertions. Run: .venv/bin/python bench/bench_sse.py
"""

from __future__ import annotations

import random
import time

import orjson

from replayer.http.chunks import StreamAccumulator
from replayer.http.sse import SSEDecoder

N_TOKENS = 500
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def make_events(continuous: bool) -> list[bytes]:
    rnd = random.Random(1)
    words = [" the", " of", " model", " token", " cache", " and", " a", " stream", "ing", ","]
    evs = []
    for i in range(N_TOKENS):
        obj = {
            "id": "cmpl-5f2c0e8a9b7d4c1e8f3a2b6d9c0e1f2a",
            "object": "text_completion",
            "created": 1767225600,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "text": rnd.choice(words),
                    "logprobs": None,
                    "finish_reason": "length" if i == N_TOKENS - 1 else None,
                    "stop_reason": None,
                }
            ],
            "usage": (
                {"prompt_tokens": 1000, "total_tokens": 1001 + i, "completion_tokens": i + 1} if continuous else None
            ),
        }
        evs.append(b"data: " + orjson.dumps(obj) + b"\n\n")
    usage = {
        "id": "cmpl-5f2c0e8a9b7d4c1e8f3a2b6d9c0e1f2a",
        "object": "text_completion",
        "created": 1767225600,
        "model": MODEL,
        "choices": [],
        "usage": {"prompt_tokens": 1000, "total_tokens": 1000 + N_TOKENS, "completion_tokens": N_TOKENS},
    }
    evs.append(b"data: " + orjson.dumps(usage) + b"\n\n")
    evs.append(b"data: [DONE]\n\n")
    return evs


def group_reads(evs: list[bytes], seed: int = 2) -> list[bytes]:
    rnd = random.Random(seed)
    reads, i = [], 0
    while i < len(evs):
        k = rnd.choice((1, 1, 1, 2, 2, 3))
        reads.append(b"".join(evs[i : i + k]))
        i += k
    return reads


def random_cut_reads(evs: list[bytes], seed: int = 3) -> list[bytes]:
    rnd = random.Random(seed)
    s = b"".join(evs)
    reads, i = [], 0
    while i < len(s):
        n = rnd.randint(50, 700)
        reads.append(s[i : i + n])
        i += n
    return reads


def bench(reads: list[bytes], n_events: int, with_acc: bool, repeat: int = 200) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time_ns()
        for _ in range(repeat):
            dec = SSEDecoder()
            if with_acc:
                acc = StreamAccumulator()
                on_event = acc.on_event
                t = 0
                for r in reads:
                    t += 1000
                    for ev in dec.feed(r):
                        on_event(ev.data, t)
                dec.close()
                acc.finish()
                acc.itl_ms()
                acc.tpot_ms()
            else:
                for r in reads:
                    dec.feed(r)
                dec.close()
        dt = (time.process_time_ns() - t0) / repeat / n_events / 1000
        best = min(best, dt)
    return best


def main() -> None:
    plain = make_events(continuous=False)
    cont = make_events(continuous=True)
    n = len(plain)
    print(
        f"stream: {N_TOKENS} token events + usage + [DONE] = {n} events, "
        f"{sum(map(len, plain)) / n:.0f} B/event (plain), {sum(map(len, cont)) / n:.0f} B/event (continuous usage)"
    )
    rows = [
        ("decode+accumulate, plain, 1-3 events/read", group_reads(plain), True),
        ("decode+accumulate, continuous usage, 1-3 events/read", group_reads(cont), True),
        ("decode+accumulate, plain, random 50-700 B reads", random_cut_reads(plain), True),
        ("decoder only, plain, 1-3 events/read", group_reads(plain), False),
        ("decoder only, plain, random 50-700 B reads", random_cut_reads(plain), False),
        (
            "decoder only, CRLF (general path), 1-3 events/read",
            group_reads([e.replace(b"\n", b"\r\n") for e in plain]),
            False,
        ),
    ]
    for name, reads, with_acc in rows:
        us = bench(reads, n, with_acc)
        print(f"{name:55s} {us:6.2f} us/event  ({len(reads)} reads)")
    # orjson.loads alone, for scale
    datas = [e[6:-2] for e in plain[:-1]]
    t0 = time.process_time_ns()
    for _ in range(200):
        for d in datas:
            orjson.loads(d)
    print(
        f"{'orjson.loads alone (reference)':55s} {(time.process_time_ns() - t0) / 200 / len(datas) / 1000:6.2f} us/event"
    )


if __name__ == "__main__":
    main()
