"""Does rolling results files grow the process? The recorder alone, no network, no replay.

    .venv/bin/python bench/bench_roll_memory.py [--results 300000] [--roll-rows 20000] [--itl 300]
                                               [--itl-format exact|sketch] [--no-release]

Prints numbers, asserts nothing. A ``Recorder`` in a temp dir takes ``--results`` results, each
with ``--itl`` ITL samples (the Mooncake trace averages ~350 tokens per request), written as a part
every 2,000 results (each flush waited for, so the writer thread is idle at each sample) and rolled
every ``--roll-rows``; every 20,000 results it prints the process's RSS and the bytes Arrow has
allocated (``pyarrow.total_allocated_bytes``: 0 means no Arrow buffer is alive). ``--no-release``
replaces ``recorder.release_memory`` (called after each roll) by a no-op: the behaviour before it
existed. The last line is the least-squares slope of RSS over results after the first two rolls,
in MB per 100k results.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import psutil
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import replayer.record.recorder as recorder  # noqa: E402
from replayer.core.result import RequestResult  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=int, default=300_000)
    ap.add_argument("--roll-rows", type=int, default=20_000)
    ap.add_argument("--itl", type=int, default=300, help="ITL samples per result")
    ap.add_argument("--itl-format", default="exact", choices=("exact", "sketch"))
    ap.add_argument("--no-release", action="store_true", help="no release_memory() after a roll (the old code)")
    a = ap.parse_args()
    if a.no_release:
        recorder.release_memory = lambda: None
    work = tempfile.mkdtemp(prefix="bench_roll_memory_")
    rec = recorder.Recorder(os.path.join(work, "r"), flush_rows=10**9, roll_rows=a.roll_rows, itl_format=a.itl_format)
    proc = psutil.Process()
    itl = np.random.default_rng(0).lognormal(3, 0.3, a.itl).astype(np.float32).tolist()
    print(
        f"# {a.results:,} results, {a.itl} ITL samples each, rolled every {a.roll_rows:,}, itl_format "
        f"{a.itl_format}, release after roll: {not a.no_release}; load %.2f %.2f %.2f" % os.getloadavg()
    )
    print(f"{'results':>9} {'rss_mb':>8} {'arrow_mb':>9}")
    pts = []
    t0 = time.monotonic()
    for i in range(a.results):
        rec.add(
            RequestResult(
                row=i,
                loop=0,
                sent_ns=i * 1000,
                end_ns=i * 1000 + 5,
                outcome="success",
                ttft_ms=1.0,
                e2e_ms=2.0,
                itl_ms=itl,
            )
        )
        if i % 2000 == 1999:
            fut = rec.flush()
            if fut is not None:
                fut.result()
        if i % 20_000 == 19_999:
            rss = proc.memory_info().rss / 2**20
            print(f"{i + 1:>9,} {rss:8.1f} {pa.total_allocated_bytes() / 2**20:9.1f}", flush=True)
            if i + 1 > 2 * a.roll_rows:
                pts.append(((i + 1) / 1e5, rss))
    rec.close()
    if len(pts) > 1:
        n = len(pts)
        mx, my = sum(p[0] for p in pts) / n, sum(p[1] for p in pts) / n
        slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
        print(
            f"RSS slope after two rolls: {slope:+.2f} MB per 100k results ({n} samples); {time.monotonic() - t0:.0f} s"
        )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
