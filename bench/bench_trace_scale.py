"""Trace scale benchmark: generate a large synthetic Parquet trace, inspect it, stream it.

    .venv/bin/python bench/bench_trace_scale.py [--rows 10000000] [--dir /tmp] [--keep]

Each step runs in its own subprocess so its peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``)
is its own. Steps:

1. ``generate``: ``synth.write_synth`` -> canonical Parquet, row groups of 65,536 rows (time, RSS,
   file size). Spec: Poisson at 1000 req/s, 16 shared system prompts of 1,024 tokens, sessions of 4
   turns (64 interleaved), user tokens lognormal(512, cv 1), output lognormal(128, cv 1), input
   capped at 16,384 tokens.
2. ``inspect``: ``tracetools.inspect_trace`` (infinite-cache hit ratio, no LRU) — the target is
   peak RSS under 1 GB.
3. ``stream``: ``trace.open_trace(path).batches(65536)`` touching every batch (rows/s, peak RSS).

Prints one line per step and a JSON summary at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def step_generate(path: str, rows: int) -> dict:
    from replayer.synth import SynthSpec, write_synth

    spec = SynthSpec(rows=rows, rate_per_s=1000.0, input_dist="lognormal:512:1.0", output_dist="lognormal:128:1.0",
                     system_prompts=16, system_prompt_tokens=1024, turns=4, sessions=64,
                     max_input_tokens=16384, seed=42)
    t0 = time.perf_counter()
    n = write_synth(spec, path)
    dt = time.perf_counter() - t0
    return {"step": "generate", "rows": n, "seconds": dt, "rows_per_s": n / dt, "peak_rss_mb": _rss_mb(),
            "file_mb": os.path.getsize(path) / 2**20}


def step_inspect(path: str) -> dict:
    from replayer.tracetools import inspect_trace

    t0 = time.perf_counter()
    s = inspect_trace(path)
    dt = time.perf_counter() - t0
    return {"step": "inspect", "rows": s["rows"], "seconds": dt, "rows_per_s": s["rows"] / dt,
            "peak_rss_mb": _rss_mb(), "unique_blocks": s["unique_blocks"],
            "prefix_hit_ratio_infinite": s["prefix_hit_ratio_infinite"], "sessions": s["sessions"],
            "peak_rate_per_s": s["peak_rate_per_s"]}


def step_stream(path: str) -> dict:
    from replayer.trace import open_trace

    t0 = time.perf_counter()
    src = open_trace(path)
    rows = 0
    tokens = 0
    for b in src.batches(65_536):
        rows += len(b)
        tokens += int(b.input_length.sum())
        b.hash_ids(len(b) - 1)
    dt = time.perf_counter() - t0
    return {"step": "stream", "rows": rows, "seconds": dt, "rows_per_s": rows / dt, "peak_rss_mb": _rss_mb(),
            "num_rows_metadata": src.num_rows}


def _child(step: str, path: str, rows: int) -> dict:
    cmd = [sys.executable, __file__, "--step", step, "--path", path, "--rows", str(rows)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--keep", action="store_true", help="keep the generated file")
    ap.add_argument("--skip-generate", action="store_true", help="reuse an existing file")
    ap.add_argument("--step", choices=("generate", "inspect", "stream"), help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.step:
        fn = {"generate": lambda: step_generate(a.path, a.rows), "inspect": lambda: step_inspect(a.path),
              "stream": lambda: step_stream(a.path)}[a.step]
        print(json.dumps(fn()))
        return 0
    path = os.path.join(a.dir, f"bench_trace_{a.rows}.parquet")
    results = []
    try:
        steps = ("inspect", "stream") if a.skip_generate else ("generate", "inspect", "stream")
        for step in steps:
            r = _child(step, path, a.rows)
            results.append(r)
            print(f"{step:9s} rows {r['rows']:>12,}  {r['seconds']:8.1f} s  {r['rows_per_s']:>12,.0f} rows/s  "
                  f"peak RSS {r['peak_rss_mb']:8.1f} MB", flush=True)
    finally:
        if not a.keep and os.path.exists(path):
            os.unlink(path)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
