"""The verdicts' CPU cost (issue 45): prints numbers, asserts nothing.

* per result, on the loop: ``VerdictWatch.on_result`` (the fan-out's ``verdicts`` step: the live
  fidelity figures and drift windows, the windows' closing and judgement included) beside the
  steps every run already has (``ReplayerMetrics.on_result``, the recorder's ``Rows.add``), on the
  results of the W1 workload's shape (the first 600 s of the shipped Mooncake slice: its output
  lengths as ITL lists, due times at 10x, 1,750 rows), with the default 300 s windows and with 1 s
  windows (a window closing every 10 results: the worst case);
* a live judgement (``VerdictWatch.judge``, when a scrape or ``/status`` asks, at most every 10 s):
  over W1's windows of 1 s, and over a week of the default 300 s windows;
* once, at the end of a run: the summary's ``verdict_sections`` over the W1 results written to a
  folder (both verdicts, three passes over the files), beside ``summarize_files``.

The per-result figure is then set against the replayer's whole CPU per request of a W1 run at
10x (``--w1-cpu-ms``, from ``bench/fidelity/run.sh W1``: process CPU seconds / requests).

Run: ``.venv/bin/python bench/bench_verdicts.py [--w1-cpu-ms MS]``. Numbers are CPU-bound and vary
with what else runs on the machine; each figure is the best of 5 repeats.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time

import numpy as np
import pyarrow.parquet as pq
from prometheus_client import CollectorRegistry

from replayer.core.result import RequestResult, Rows, to_table
from replayer.observe.metrics import ReplayerMetrics
from replayer.results.drift import judge_drift
from replayer.results.summary import summarize_files
from replayer.results.verdicts import verdict_sections
from replayer.results.verdictwatch import LIVE_MAX_PAIRS, VerdictWatch

TRACE = os.path.join(os.path.dirname(__file__), "..", "traces", "mooncake_conversation_10min.parquet")


def w1_results() -> list[RequestResult]:
    """Results shaped as W1's: the slice's rows at 10x, each a success with one ITL per token."""
    t = pq.read_table(TRACE).to_pydict()
    rng = np.random.default_rng(0)
    out = []
    for i, (ts, n_in, n_out) in enumerate(zip(t["timestamp"], t["input_length"], t["output_length"])):
        due = int(ts * 1e6 / 10)  # (ms of trace at 10x -> ns of run)
        itl = (10.0 + rng.exponential(1.0, max(n_out - 1, 0))).tolist()
        out.append(
            RequestResult(
                row=i,
                due_ns=due,
                sent_ns=due + 20_000,
                first_token_ns=due + 40_000_000,
                end_ns=due + 40_000_000 + int(sum(itl) * 1e6),
                outcome="success",
                input_length=n_in,
                prompt_len_sent=n_in,
                output_length=n_out,
                max_tokens=n_out,
                prompt_tokens=n_in,
                completion_tokens=n_out,
                usage_source="server",
                ttft_ms=40.0 + rng.exponential(5.0),
                e2e_ms=40.0 + sum(itl),
                tpot_ms=float(np.mean(itl)) if itl else None,
                dispatch_lag_ms=0.02,
                itl_ms=itl,
            )
        )
    return out


def per_result_us(step, results: list[RequestResult], repeat: int = 5) -> float:
    """Best CPU time per result (us) of ``step`` over every result, fresh state each repeat."""
    best = float("inf")
    for _ in range(repeat):
        call = step()
        t = time.process_time()
        for r in results:
            call(r)
        best = min(best, (time.process_time() - t) / len(results) * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--w1-cpu-ms", type=float, default=None, help="the replayer's CPU ms per request on W1")
    a = ap.parse_args()
    results = w1_results()
    print(f"W1-shaped results: {len(results):,}, {sum(len(r.itl_ms) for r in results):,} ITL samples")
    rows = {
        "VerdictWatch.on_result, 300 s windows": lambda: VerdictWatch(None, window_s=300.0).on_result,
        "VerdictWatch.on_result, 1 s windows": lambda: VerdictWatch(None, window_s=1.0).on_result,
        "ReplayerMetrics.on_result": lambda: ReplayerMetrics(CollectorRegistry(), process_collector=False).on_result,
        "Rows.add (the recorder's)": lambda: Rows().add,
    }
    cost = {name: per_result_us(step, results) for name, step in rows.items()}
    for name, us in cost.items():
        print(f"{name:45s} {us:8.1f} us/result")
    if a.w1_cpu_ms:
        for name in list(cost)[:2]:
            print(f"{name:45s} {cost[name] / (a.w1_cpu_ms * 1e3):8.2%} of the replayer's CPU per request on W1")
    watch = VerdictWatch(None, window_s=1.0)
    for r in results:
        watch.on_result(r)
    t = time.process_time()
    watch.judge()
    print(
        f"{'a live judgement (' + str(len(watch.rows)) + ' windows of 1 s)':45s} {(time.process_time() - t) * 1e3:8.1f} ms"
    )
    series = [dict(watch.rows[i % len(watch.rows)], t_s=i * 300.0 + 150, position=i) for i in range(2016)]
    t = time.process_time()
    judge_drift(series, window_s=300.0, max_pairs=LIVE_MAX_PAIRS)
    print(f"{'a live judgement (a week of 300 s windows)':45s} {(time.process_time() - t) * 1e3:8.1f} ms")
    with tempfile.TemporaryDirectory() as d:
        pq.write_table(to_table(copy.deepcopy(results)), os.path.join(d, "requests.parquet"))
        for name, fn in (
            ("summarize_files (every run's summary)", lambda: summarize_files([os.path.join(d, "requests.parquet")])),
            ("verdict_sections (fidelity + drift)", lambda: verdict_sections([d], {"scheduled": len(results)})),
        ):
            best = float("inf")
            for _ in range(5):
                t = time.process_time()
                fn()
                best = min(best, time.process_time() - t)
            print(f"{name:45s} {best * 1e3:8.1f} ms once, at the end")


if __name__ == "__main__":
    main()
