"""Case B30 (issue 19): 10,000,000 ITL samples folded into one ``replayer.core.stats.Stat``, with the
process RSS after 1,000,000 and after 10,000,000 samples, and the case's exact values.

    .venv/bin/python bench/bench_b30_sketch.py [--requests 200000]

The feed: 200,000 requests of 50 gaps each, gap k (0-based, feed order) = 5 + (k mod 40) ms,
folded 1,000 requests (50,000 gaps) at a time, as the summary folds results batch by batch. The
second pass feeds the same gaps in nanoseconds with 1e12 ns added. Prints numbers; asserts
nothing (the exact values on a smaller feed are asserted in ``tests/test_stats.py``). Case
values: count 10,000,000, min 5, max 44, sum 245,000,000 ms, mean 24.5, population std 11.5434
ms; nearest-rank p50 24, p90 40, p99 44 (a sketch within 0.5 ms); RSS growth < 16 MiB; second
pass std 11,543,396 ns +- 0.01 %.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import psutil

from replayer.core.stats import Stat


def feed(
    stat: Stat, requests: int, *, scale: float = 1.0, offset: float = 0.0, rss_at: int | None = None
) -> float | None:
    """Fold the B30 feed into ``stat``; returns the RSS (MiB) once ``rss_at`` gaps are in."""
    rss = None
    per = 1_000
    for r in range(0, requests, per):
        k = np.arange(r * 50, min(requests, r + per) * 50, dtype=np.int64)
        stat.add((5 + k % 40) * scale + offset)
        if rss_at is not None and rss is None and stat.count >= rss_at:
            rss = psutil.Process().memory_info().rss / 2**20
    return rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200_000)
    args = ap.parse_args()
    t = time.perf_counter()
    ms = Stat()
    rss_1m = feed(ms, args.requests, rss_at=1_000_000)
    rss_end = psutil.Process().memory_info().rss / 2**20
    took = time.perf_counter() - t
    print(
        f"count {ms.count:,}  min {ms.min:g}  max {ms.max:g}  sum {ms.total:,.0f} ms  mean {ms.mean:.4f} ms  "
        f"std {ms.std():.4f} ms"
    )
    print(
        "nearest-rank p50 / p90 / p99 (ms): "
        + " / ".join(f"{ms.percentile(p):.3f}" for p in (50, 90, 99))
        + f"  (from the {'values' if ms.exact else 'sketch'})"
    )
    print(
        f"RSS after 1,000,000 samples {rss_1m:.1f} MiB, after {ms.count:,} {rss_end:.1f} MiB: "
        f"growth {rss_end - rss_1m:+.1f} MiB; {took:.1f} s ({ms.count / took / 1e6:.1f} M samples/s)"
    )
    ns = Stat()
    feed(ns, args.requests, scale=1e6, offset=1e12)
    print(f"second pass (ns + 1e12): std {ns.std():,.1f} ns (case: 11,543,396 +- 0.01 %), mean {ns.mean:,.1f} ns")


if __name__ == "__main__":
    main()
