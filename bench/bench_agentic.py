"""Agentic reader benchmark: a synthetic GitHub Copilot coding agent shard, read and converted.

    .venv/bin/python bench/bench_agentic.py [--sessions 500] [--dir /tmp] [--keep]

The release's shards hold ~500 sessions each (avg 3.95 turns of 7.83 LLM calls). This writes one
such shard (gzip JSONL, seeded): per call a prompt that grows from ~8k tokens by lognormal steps
(mean 1,500 tokens, cut at 128k), 90 % of the previous prompt cached within a turn, 55 % across a
turn boundary, completion lognormal(mean 200), one tool batch per call. Then, each in its own
subprocess (peak RSS is its own): ``read_trace`` (calls/s, peak RSS) and ``trace convert``
to canonical Parquet (seconds, file size). Prints numbers, asserts nothing.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone


def write_shard(path: str, sessions: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    t0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
    calls = 0
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for s in range(sessions):
            t = t0 + timedelta(seconds=rng.uniform(0, 86_400))
            prompt = 8000
            turns = []
            for k in range(max(1, round(rng.expovariate(1 / 3.95)))):
                llm, tools = [], []
                for c in range(max(1, round(rng.expovariate(1 / 7.83)))):
                    prev = prompt
                    prompt = min(128_000, prompt + int(rng.lognormvariate(7.0, 0.8)))
                    cached = int(prev * (0.9 if c else 0.55))
                    dur = rng.uniform(300, 5000)
                    mid = f"m{s}-{k}-{c}"
                    llm.append(
                        {
                            "message_id": mid,
                            "timestamp": t.isoformat().replace("+00:00", "Z"),
                            "duration_ms": dur,
                            "initiator_type": "agent" if c else "user",
                            "model": "Model A",
                            "tokens": {
                                "prompt": prompt,
                                "completion": max(1, int(rng.lognormvariate(5, 0.7))),
                                "cached": cached,
                            },
                        }
                    )
                    t += timedelta(milliseconds=dur)
                    tool = rng.uniform(50, 3000)
                    tools.append(
                        {
                            "timestamp": t.isoformat().replace("+00:00", "Z"),
                            "duration_ms": tool,
                            "request_id": mid,
                            "function_calls": [{"name": "run", "status": 1, "duration_ms": tool}],
                        }
                    )
                    t += timedelta(milliseconds=tool)
                    calls += 1
                turns.append({"turn_id": f"t{k}", "llm_calls": llm, "tool_batches": tools})
                t += timedelta(seconds=rng.expovariate(1 / 60))
            f.write(json.dumps({"session_id": f"s{s}", "date": "2026-06-01", "turns": turns}) + "\n")
    return calls


def _step_read(path: str) -> None:
    import warnings

    from replayer.trace import read_trace

    warnings.simplefilter("ignore")
    t = time.perf_counter()
    tr = read_trace(path)
    dt = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "step": "read",
                "calls": len(tr),
                "blocks": int(tr.hash_values.size),
                "seconds": dt,
                "calls_per_s": len(tr) / dt,
                "peak_rss_mb": rss,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--step", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.step == "read":
        _step_read(a.path)
        return
    path = os.path.join(a.dir, f"bench-copilot-{a.sessions}.jsonl.gz")
    t = time.perf_counter()
    calls = write_shard(path, a.sessions)
    print(
        json.dumps(
            {
                "step": "generate",
                "sessions": a.sessions,
                "calls": calls,
                "seconds": time.perf_counter() - t,
                "bytes": os.path.getsize(path),
            }
        ),
        flush=True,
    )
    subprocess.run([sys.executable, __file__, "--step", "read", "--path", path], check=True)
    out = path.replace(".jsonl.gz", ".parquet")
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "replayer", "trace", "convert", path, "-o", out], check=True, capture_output=True
    )
    print(json.dumps({"step": "convert", "seconds": time.perf_counter() - t, "parquet_bytes": os.path.getsize(out)}))
    if not a.keep:
        os.remove(path)
        os.remove(out)


if __name__ == "__main__":
    main()
