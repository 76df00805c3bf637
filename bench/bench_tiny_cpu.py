"""CPU per tiny request on the replayer's per-request Python paths (issue 17), without sockets.

    .venv/bin/python bench/bench_tiny_cpu.py [--n 1000] [--runs 7] [--part all|prepare|metrics]

N rows of 16 prompt tokens and 1 output token (a hash id each, as ``bench_tiny.py`` writes) go
through what ``replayer run`` does per request on its event loop, outside the client: the
request body and the expected prefix-cache hits (``RequestFactory.prepare``, then the run's
``on_prepared`` metric hook), then the metric hooks of a successful request (``on_sent``, ``on_dispatched``,
``on_result``). The cyclic GC is off while measuring, as during a replay (``replayer.run.gcpacer``).
Prints the median and min over ``--runs`` of CPU microseconds per request (``time.process_time``:
other processes on a loaded machine do not count), per part.

Instruction counts, repeatable whatever the load: run it under ``valgrind --tool=callgrind``
with ``--runs 1`` for two values of ``--n`` and divide the difference of the totals by the
difference of the requests (times 2: the warm-up pass runs too).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from prometheus_client import CollectorRegistry  # noqa: E402

from replayer.config.model import load_config  # noqa: E402
from replayer.observe.metrics import ReplayerMetrics  # noqa: E402
from replayer.payload.body import PayloadBuilder  # noqa: E402
from replayer.payload.loopprompts import Prompts  # noqa: E402
from replayer.payload.prepare import RequestFactory  # noqa: E402
from replayer.plan.schedule import Timeline, iter_schedule  # noqa: E402
from replayer.trace import open_trace  # noqa: E402


def write_trace(path: str, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(
                json.dumps({"timestamp": round(i * 0.2, 6), "input_length": 16, "output_length": 1, "hash_ids": [i]})
                + "\n"
            )


def one_run(trace: str, part: str) -> tuple[float, float, int]:
    """(prepare CPU s, metrics CPU s, requests) of one pass over the trace with fresh state."""
    cfg = load_config({"trace": trace, "format": "jsonl", "time_unit": "ms"})
    source = open_trace(trace, fmt="jsonl", time_unit="ms")
    metrics = ReplayerMetrics(CollectorRegistry(), config_info={"speedup": "1.0"})
    factory = RequestFactory(
        Prompts(
            cfg.block_size or source.block_size,
            seed=cfg.seed,
            vocab_range=cfg.vocab_bounds,
            kv_block_size=cfg.kv_block_size,
            cache_tokens=cfg.expected_cache_tokens,
        ),
        PayloadBuilder("sim-model"),
        Timeline(1.0),
    )
    sbs = list(iter_schedule(lambda: source.batches(65_536)))
    reqs = []
    gc.collect()
    gc.disable()
    t = time.process_time()
    if part in ("all", "prepare"):
        for sb in sbs:
            for j in range(len(sb.idx)):
                req = factory.prepare(sb, j)
                metrics.on_prepared(req)  # as the run counts each request built
                reqs.append(req)
    t_prep = time.process_time() - t
    if not reqs:  # metrics only: requests built outside the measurement
        for sb in sbs:
            for j in range(len(sb.idx)):
                reqs.append(factory.prepare(sb, j))
    results = []
    for r in reqs:
        res = r.new_result(0)
        res.sent_ns, res.first_token_ns, res.last_token_ns, res.end_ns = (
            r.due_ns + 50_000,
            r.due_ns + 400_000,
            r.due_ns + 400_000,
            r.due_ns + 420_000,
        )
        res.outcome, res.prompt_tokens, res.completion_tokens, res.usage_source = "success", 16, 1, "server"
        res.n_chunks, res.finish_reason, res.ttft_ms, res.e2e_ms = 1, "length", 0.35, 0.35
        res.dispatch_lag_ms, res.ttft_from_due_ms, res.e2el_from_due_ms = 0.05, 0.4, 0.4
        results.append(res)
    t = time.process_time()
    if part in ("all", "metrics"):
        for r, res in zip(reqs, results):
            metrics.on_sent(r)
            metrics.on_dispatched(res)
            metrics.on_result(res)
    t_met = time.process_time() - t
    gc.enable()
    return t_prep, t_met, len(reqs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--part", choices=("all", "prepare", "metrics"), default="all")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "tiny.jsonl")
        write_trace(trace, args.n)
        one_run(trace, args.part)  # warm-up (imports, first-call caches)
        prep, met = [], []
        for _ in range(args.runs):
            p, m, n = one_run(trace, args.part)
            prep.append(p / n * 1e6)
            met.append(m / n * 1e6)
    tot = [p + m for p, m in zip(prep, met)]
    for name, xs in (
        ("prepare (body + expected hits)", prep),
        ("metric hooks (sent, dispatched, result)", met),
        ("total", tot),
    ):
        print(
            f"{name:40s}: median {statistics.median(xs):7.2f} us/request, min {min(xs):7.2f} "
            f"({args.runs} runs of {args.n})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
