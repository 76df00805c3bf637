"""Tiny-request rate benchmark (issue 17): the highest rate of tiny requests the replayer holds.

    .venv/bin/python bench/bench_tiny.py [--n 1000] [--lo 500] [--hi 20000] [--steps 5]
                                         [--target URL] [--p99-ms 10] [--profile DIR]
                                         [--processes K]

Each trial replays, through the real CLI (``replayer run``: trace reader, preparation,
dispatcher, launcher process, client, recorder, metrics), N requests of 16 prompt tokens and 1
output token, evenly spaced at the trial's rate (0.2 ms apart = 5,000 requests/s), against a fast
target on 127.0.0.1: ``replayer sim`` in its own process with no prefill or token delay (or
``--target URL``). A rate is *held* when every request succeeds and the dispatch error p99
(``dispatch_lag_p99_ms`` of the summary: actual send - due time) is at most ``--p99-ms``.

Search (bounded): doubling from ``--lo`` until a rate is not held (or ``--hi``), then ``--steps``
bisections between the last held and the first missed rate. Prints per trial: rate, dispatch
lag p50/p99/max, the spread of the sends against the schedule's span, the replayer's CPU time per
request (user + system of the ``replayer run`` process and its launcher child), and at the end
the highest rate held. ``--profile DIR`` runs each trial under cProfile (``DIR/tiny-RATE.prof``;
slower: for finding where the time goes, not for the rate). ``--processes K``: each trial is a
fleet of K shard processes (``--shard i/K``) started together by ``replayer coordinate``; the
rate is the fleet's, held when every shard's p99 is. Asserts nothing; numbers vary with what else
runs on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


# ``replayer`` under cProfile with a CPU-time timer; argv[1] is the output file
PROFILED = """
import cProfile, sys, time
from replayer.cli import main
out = sys.argv.pop(1)
prof = cProfile.Profile(time.process_time)
try:
    prof.runcall(main, sys.argv[1:])
finally:
    prof.dump_stats(out)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def write_trace(path: str, n: int, rate: float) -> float:
    """N tiny rows (16 prompt tokens, 1 output token, a hash id of their own), ``1/rate`` s apart,
    as JSON lines with fractional-ms timestamps; returns the schedule's span (ms)."""
    gap_ms = 1e3 / rate
    with open(path, "w") as f:
        for i in range(n):
            f.write(
                json.dumps({"timestamp": round(i * gap_ms, 6), "input_length": 16, "output_length": 1, "hash_ids": [i]})
                + "\n"
            )
    return (n - 1) * gap_ms


def fleet_trial(target: str, n: int, rate: float, work: str, k: int) -> dict:
    """A trial sent by ``k`` shard processes that start together (``replayer coordinate``)."""
    trace = os.path.join(work, f"tiny-{rate:.0f}.jsonl")
    span_ms = write_trace(trace, n, rate)
    port = _free_port()
    base = [sys.executable, "-m", "replayer"]
    co = subprocess.Popen([*base, "coordinate", "--shards", str(k), "--port", str(port)], cwd=ROOT,
                          stderr=subprocess.DEVNULL)  # fmt: skip
    _wait(f"http://127.0.0.1:{port}/healthz")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    shards = []
    for i in range(k):
        results = os.path.join(work, f"run-{rate:.0f}-{i}")
        cmd = [*base, "run", trace, "--format", "jsonl", "--time-unit", "ms", "--target", target]
        cmd += ["--shard", f"{i}/{k}", "--coordinator", f"http://127.0.0.1:{port}", "--results", results]
        cmd += ["--admin-port", "0", "--quiet", "--log-level", "warning", "--no-scrape-target-metrics"]
        shards.append(
            (results, subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        )
    for _, p in shards:
        _, err = p.communicate(timeout=300)
        if p.returncode != 0:
            raise SystemExit(f"replayer run failed ({p.returncode}):\n{err[-3000:]}")
    co.wait(60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    ss = [json.load(open(os.path.join(r, "summary.json"))) for r, _ in shards]
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    worst = [s["dispatch_lag_p99_ms"] for s in ss]
    return {
        "rate": rate,
        "completed": sum(s["completed"] for s in ss),
        "failed": sum(s["failed"] for s in ss),
        "lag_p50_ms": max(s["dispatch_lag_p50_ms"] for s in ss),
        "lag_p99_ms": None if None in worst else max(worst),
        "lag_max_ms": max(s["dispatch_lag_max_ms"] for s in ss),
        "span_ms": span_ms,
        "sent_spread_ms": None,
        "cpu_ms_per_request": 1e3 * cpu_s / n,
    }


def trial(target: str, n: int, rate: float, work: str, profile_dir: str | None, k: int = 1) -> dict:
    if k > 1:
        return fleet_trial(target, n, rate, work, k)
    trace = os.path.join(work, f"tiny-{rate:.0f}.jsonl")
    span_ms = write_trace(trace, n, rate)
    results = os.path.join(work, f"run-{rate:.0f}")
    cmd = [sys.executable]
    if profile_dir:  # CPU time, not wall time: on a busy machine wall time counts other processes' turns
        out = os.path.join(profile_dir, f"tiny-{rate:.0f}.prof")
        cmd += ["-c", PROFILED, out]
    else:
        cmd += ["-m", "replayer"]
    cmd += [
        "run",
        trace,
        "--format",
        "jsonl",
        "--time-unit",
        "ms",
        "--target",
        target,
        "--results",
        results,
        "--admin-port",
        "0",
        "--quiet",
        "--log-level",
        "warning",
        "--no-scrape-target-metrics",
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"replayer run failed ({p.returncode}):\n{p.stderr[-3000:]}")
    s = json.load(open(os.path.join(results, "summary.json")))
    import pyarrow.parquet as pq  # (after the run: not in the measured process)

    sent = pq.read_table(os.path.join(results, "requests.parquet"), columns=["sent_ns"]).column("sent_ns")
    sent = [x for x in sent.to_pylist() if x is not None]
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "rate": rate,
        "completed": s["completed"],
        "failed": s["failed"],
        "lag_p50_ms": s["dispatch_lag_p50_ms"],
        "lag_p99_ms": s["dispatch_lag_p99_ms"],
        "lag_max_ms": s["dispatch_lag_max_ms"],
        "span_ms": span_ms,
        "sent_spread_ms": (max(sent) - min(sent)) / 1e6 if sent else None,
        "cpu_ms_per_request": 1e3 * cpu_s / n,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="requests per trial")
    ap.add_argument("--lo", type=float, default=500.0, help="first rate tried (requests/s)")
    ap.add_argument("--hi", type=float, default=20000.0, help="highest rate tried")
    ap.add_argument("--steps", type=int, default=5, help="bisections after the doubling")
    ap.add_argument("--p99-ms", type=float, default=10.0, help="dispatch error p99 a held rate keeps")
    ap.add_argument("--target", help="an OpenAI-compatible server (default: replayer sim, no delays)")
    ap.add_argument("--profile", metavar="DIR", help="write a cProfile of each trial into DIR")
    ap.add_argument("--processes", type=int, default=1, help="shard processes started together (a fleet)")
    args = ap.parse_args()
    sim = None
    target = args.target
    if target is None:
        port = _free_port()
        sim = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "replayer",
                "sim",
                "--port",
                str(port),
                "--ttft-base-ms",
                "0",
                "--itl-base-ms",
                "0",
                "--prefill-us-per-token",
                "0",
                "--itl-per-running-us",
                "0",
            ],
            cwd=ROOT,
        )
        target = f"http://127.0.0.1:{port}"
        _wait(target + "/health")
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    print(
        f"{'rate/s':>8} {'ok':>5} {'fail':>4} {'lag p50':>8} {'p99':>8} {'max':>8} {'spread/span ms':>16} "
        f"{'CPU ms/req':>10}  held"
    )
    held_best, missed = None, None

    def run(rate: float) -> bool:
        r = trial(target, args.n, rate, work, args.profile, args.processes)
        ok = (
            r["failed"] == 0
            and r["completed"] == args.n
            and r["lag_p99_ms"] is not None
            and r["lag_p99_ms"] <= args.p99_ms
        )
        spread = f"{r['sent_spread_ms']:.0f}/{r['span_ms']:.0f}" if r["sent_spread_ms"] is not None else "n/a"
        print(
            f"{rate:8.0f} {r['completed']:5d} {r['failed']:4d} {r['lag_p50_ms']:8.2f} {r['lag_p99_ms']:8.2f} "
            f"{r['lag_max_ms']:8.2f} {spread:>16} {r['cpu_ms_per_request']:10.3f}  {'yes' if ok else 'no'}",
            flush=True,
        )
        return ok

    try:
        with tempfile.TemporaryDirectory(prefix="bench-tiny-") as work:
            rate = args.lo
            while rate <= args.hi:
                if not run(rate):
                    missed = rate
                    break
                held_best = rate
                rate *= 2
            lo, hi = held_best, missed
            for _ in range(args.steps if lo is not None and hi is not None else 0):
                mid = (lo + hi) / 2
                if run(mid):
                    lo = mid
                else:
                    hi = mid
            held_best = lo
    finally:
        if sim is not None:
            sim.terminate()
            sim.wait(10)
    if held_best is None:
        print(f"no rate held (the first, {args.lo:.0f}/s, missed p99 <= {args.p99_ms:g} ms)")
    else:
        bound = f"; {hi:.0f}/s missed" if hi is not None else " (the highest tried)"
        print(
            f"highest rate held: {held_best:.0f} requests/s with dispatch error p99 <= {args.p99_ms:g} ms"
            f" ({args.n} requests of 16+1 tokens{bound}; {args.processes} process(es))"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
