"""Trace scale benchmark: generate a large synthetic Parquet trace, inspect it, stream it, replay it.

    .venv/bin/python bench/bench_trace_scale.py [--rows 10000000] [--dir /tmp] [--keep]
    .venv/bin/python bench/bench_trace_scale.py --replay        # + one minute of `replayer run`

Each step runs in its own subprocess so its peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``)
is its own. Steps:

1. ``generate``: ``synth.write_synth`` -> canonical Parquet, row groups of 65,536 rows (time, RSS,
   file size). Spec: Poisson at 1000 req/s, 16 shared system prompts of 1,024 tokens, sessions of 4
   turns (64 interleaved), user tokens lognormal(512, cv 1), output lognormal(128, cv 1), input
   capped at 16,384 tokens.
2. ``inspect``: ``traceinspect.inspect_trace`` (expected prefix-cache hits, as a replay's) — the target is
   peak RSS under 1 GB.
3. ``stream``: ``trace.open_trace(path).batches(65536)`` touching every batch (rows/s, peak RSS).

4. ``replay`` (with ``--replay``): ``python -m replayer run TRACE --validate-trace lazy --duration
   60 --speedup S --results DIR --admin-port 0 --quiet`` against the embedded simulator, where
   ``S = --replay-rps / --rate`` (default 250 req/s offered, so the minute holds ~15k requests).
   With ``--replay`` the trace defaults to ``--rate 5`` (10M rows span ~23 days) and short outputs
   (``--output-dist uniform:1:4``) unless those flags are given. A psutil thread samples the RSS
   of the replayer process tree (replayer + embedded sim) every 50 ms; reported: peak RSS of the
   tree and of the replayer alone (target < 1 GB), time from process start (wall clock recorded
   just before ``Popen``) to the first request's send (``replayer.t0_wall_s`` from the results
   Parquet metadata + min ``sent_ns``; target < 2 s; the ``--start-delay`` anchor, 1 s by default,
   is part of it and shown separately), dispatch lag p99 (summary.json) and the share of requests
   with ``dispatch_lag_ms > 10`` (did the reader keep up).

Prints one line per step (with the load average) and a JSON summary at the end. Prints numbers,
asserts nothing.
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


def step_generate(path: str, rows: int, rate: float = 1000.0, output_dist: str = "lognormal:128:1.0") -> dict:
    from replayer.trace.synth import SynthSpec, write_synth

    spec = SynthSpec(
        rows=rows,
        rate_per_s=rate,
        input_dist="lognormal:512:1.0",
        output_dist=output_dist,
        system_prompts=16,
        system_prompt_tokens=1024,
        turns=4,
        sessions=64,
        max_input_tokens=16384,
        seed=42,
    )
    t0 = time.perf_counter()
    n = write_synth(spec, path)
    dt = time.perf_counter() - t0
    return {
        "step": "generate",
        "rows": n,
        "seconds": dt,
        "rows_per_s": n / dt,
        "peak_rss_mb": _rss_mb(),
        "file_mb": os.path.getsize(path) / 2**20,
    }


def step_inspect(path: str) -> dict:
    from replayer.results.traceinspect import inspect_trace

    t0 = time.perf_counter()
    s = inspect_trace(path)
    dt = time.perf_counter() - t0
    return {
        "step": "inspect",
        "rows": s["rows"],
        "seconds": dt,
        "rows_per_s": s["rows"] / dt,
        "peak_rss_mb": _rss_mb(),
        "unique_blocks": s["unique_blocks"],
        "prefix_hit_ratio": s["prefix_hit_ratio"],
        "sessions": s["sessions"],
        "peak_rate_per_s": s["peak_rate_per_s"],
    }


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
    return {
        "step": "stream",
        "rows": rows,
        "seconds": dt,
        "rows_per_s": rows / dt,
        "peak_rss_mb": _rss_mb(),
        "num_rows_metadata": src.num_rows,
    }


def _child(step: str, path: str, rows: int, rate: float, output_dist: str) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--step",
        step,
        "--path",
        path,
        "--rows",
        str(rows),
        "--rate",
        str(rate),
        "--output-dist",
        output_dist,
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _load() -> str:
    return "%.2f %.2f %.2f" % os.getloadavg()


def step_replay(
    path: str, workdir: str, *, speedup: float, seconds: float, extra: list[str], sample_s: float = 0.05
) -> dict:
    """One ``replayer run`` of ``seconds`` against the embedded sim, sampled with psutil."""
    import glob
    import shlex
    import shutil
    import threading

    import numpy as np
    import psutil
    import pyarrow.parquet as pq

    results = os.path.join(workdir, f"bench_replay_{os.getpid()}")
    shutil.rmtree(results, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "replayer",
        "run",
        path,
        "--validate-trace",
        "lazy",
        "--duration",
        f"{seconds:g}",
        "--speedup",
        f"{speedup:g}",
        "--results",
        results,
        "--admin-port",
        "0",
        "--quiet",
        *extra,
    ]
    print("$ " + shlex.join(cmd), flush=True)
    peak = {"tree": 0, "replayer": 0, "sim": 0, "procs": 0}
    stop = threading.Event()

    def sample(proc: psutil.Process) -> None:
        while not stop.is_set():
            try:
                own = proc.memory_info().rss
                kids = proc.children(recursive=True)
            except psutil.Error:
                break
            sim = 0
            for k in kids:
                try:
                    sim += k.memory_info().rss
                except psutil.Error:
                    pass
            peak["replayer"] = max(peak["replayer"], own)
            peak["sim"] = max(peak["sim"], sim)
            peak["tree"] = max(peak["tree"], own + sim)
            peak["procs"] = max(peak["procs"], 1 + len(kids))
            stop.wait(sample_s)

    err_path = os.path.join(workdir, f"bench_replay_{os.getpid()}.err")
    load_before = _load()
    t_wall0 = time.time()
    t_mono0 = time.perf_counter()
    with open(err_path, "w") as err:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        th = threading.Thread(target=sample, args=(psutil.Process(p.pid),), daemon=True)
        th.start()
        try:
            rc = p.wait(timeout=seconds + 180)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
    elapsed = time.perf_counter() - t_mono0
    stop.set()
    th.join(2)
    load_after = _load()
    files = sorted(glob.glob(os.path.join(results, "requests*.parquet")))
    if rc != 0 or not files:
        with open(err_path) as f:
            tail = f.read()[-2000:]
        raise RuntimeError(f"replayer run failed (exit {rc}); stderr tail:\n{tail}")
    t0_wall = float(pq.read_schema(files[0]).metadata[b"replayer.t0_wall_s"])
    cols = ["sent_ns", "due_ns", "dispatch_lag_ms", "outcome"]
    import pyarrow as pa

    table = pa.concat_tables([pq.read_table(f, columns=cols) for f in files])
    sent = table.column("sent_ns").to_numpy(zero_copy_only=False)
    sent = sent[~np.isnan(sent)] if sent.dtype.kind == "f" else sent
    lag = table.column("dispatch_lag_ms").to_numpy(zero_copy_only=False).astype(float)
    lag = lag[~np.isnan(lag)]
    with open(os.path.join(results, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    first_sent_wall = t0_wall + float(sent.min()) / 1e9
    # start-up phases from the replayer's own log lines (asctime has ms resolution, local time)
    import re
    from datetime import datetime

    phases = {}
    marks = (
        ("admin server on", "admin_up"),
        ("no --target", "sim_spawned"),
        ("replaying ", "target_ready"),
        ("opened ", "connections_warmed"),
    )
    with open(err_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+: (.*)", line)
            if not m:
                continue
            ts = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for prefix, name in marks:
                if m.group(2).startswith(prefix) and name not in phases:
                    phases[name] = round(ts - t_wall0, 3)
    out = {
        "step": "replay",
        "rows": int(table.num_rows),
        "seconds": elapsed,
        "rows_per_s": len(sent) / seconds,
        "speedup": speedup,
        "exit_code": rc,
        "sent": int(len(sent)),
        "completed": summary.get("completed"),
        "failed": summary.get("failed"),
        "not_started": summary.get("not_started"),
        "peak_rss_mb": peak["tree"] / 2**20,
        "peak_rss_replayer_mb": peak["replayer"] / 2**20,
        "peak_rss_sim_mb": peak["sim"] / 2**20,
        "processes": peak["procs"],
        "start_to_anchor_s": t0_wall - t_wall0,
        "start_to_first_send_s": first_sent_wall - t_wall0,
        "dispatch_lag_p50_ms": summary.get("dispatch_lag_p50_ms"),
        "dispatch_lag_p99_ms": summary.get("dispatch_lag_p99_ms"),
        "dispatch_lag_max_ms": summary.get("dispatch_lag_max_ms"),
        "lag_gt_10ms_share": float((lag > 10).mean()) if lag.size else None,
        "median_ttft_ms": summary.get("median_ttft_ms"),
        "load_before": load_before,
        "load_after": load_after,
        "startup_phases_s": phases,
        "command": shlex.join(cmd),
    }
    shutil.rmtree(results, ignore_errors=True)
    os.unlink(err_path)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--keep", action="store_true", help="keep the generated file")
    ap.add_argument("--skip-generate", action="store_true", help="reuse an existing file")
    ap.add_argument(
        "--rate", type=float, default=None, help="trace arrival rate, req/s [default: 1000; 5 with --replay]"
    )
    ap.add_argument(
        "--output-dist", default=None, help="output tokens [default: lognormal:128:1.0; uniform:1:4 with --replay]"
    )
    ap.add_argument("--replay", action="store_true", help="also replay one minute with `replayer run`")
    ap.add_argument(
        "--only", default=None, metavar="STEPS", help="comma-separated subset of generate,inspect,stream,replay"
    )
    ap.add_argument("--replay-seconds", type=float, default=60.0, help="--duration of the replay")
    ap.add_argument("--replay-rps", type=float, default=250.0, help="offered requests/s: speedup = this / rate")
    ap.add_argument("--speedup", type=float, default=None, help="override the computed speedup")
    ap.add_argument("--run-args", default="", help="extra `replayer run` flags, e.g. '--start-delay 0.2'")
    ap.add_argument("--step", choices=("generate", "inspect", "stream"), help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    a = ap.parse_args()
    rate = a.rate if a.rate is not None else (5.0 if a.replay else 1000.0)
    output_dist = a.output_dist or ("uniform:1:4" if a.replay else "lognormal:128:1.0")
    if a.step:
        fn = {
            "generate": lambda: step_generate(a.path, a.rows, rate, output_dist),
            "inspect": lambda: step_inspect(a.path),
            "stream": lambda: step_stream(a.path),
        }[a.step]
        print(json.dumps(fn()))
        return 0
    import shlex

    path = a.path or os.path.join(a.dir, f"bench_trace_{a.rows}_{rate:g}_{output_dist.replace(':', '-')}.parquet")
    results = []
    if a.only:
        steps = tuple(x.strip() for x in a.only.split(","))
    else:
        steps = ("inspect", "stream") if a.skip_generate else ("generate", "inspect", "stream")
        if a.replay:
            steps += ("replay",)
    print(f"# trace {path}: {a.rows:,} rows at {rate:g} req/s, output {output_dist}; load {_load()}", flush=True)
    try:
        for step in steps:
            load = _load()
            if step == "replay":
                speedup = a.speedup or a.replay_rps / rate
                r = step_replay(path, a.dir, speedup=speedup, seconds=a.replay_seconds, extra=shlex.split(a.run_args))
            else:
                r = _child(step, path, a.rows, rate, output_dist)
            results.append(r)
            print(
                f"{step:9s} rows {r['rows']:>12,}  {r['seconds']:8.1f} s  {r['rows_per_s']:>12,.0f} rows/s  "
                f"peak RSS {r['peak_rss_mb']:8.1f} MB  load before {load}",
                flush=True,
            )
        rep = [r for r in results if r["step"] == "replay"]
        if rep:
            r = rep[0]
            print("\nreplay (one minute of the trace, embedded sim)")
            rowsfmt = [
                ("command", r["command"]),
                (
                    "speedup / requests sent / completed / failed",
                    f"{r['speedup']:g} / {r['sent']:,} / {r['completed']} / {r['failed']}",
                ),
                ("peak RSS, process tree (MB) [target < 1024]", f"{r['peak_rss_mb']:.1f} ({r['processes']} processes)"),
                (
                    "peak RSS, replayer alone / sim (MB)",
                    f"{r['peak_rss_replayer_mb']:.1f} / {r['peak_rss_sim_mb']:.1f}",
                ),
                ("start-up phases from the log (s after start)", json.dumps(r["startup_phases_s"])),
                ("process start -> t0 anchor (s)", f"{r['start_to_anchor_s']:.3f} (includes --start-delay)"),
                ("process start -> first send (s) [target < 2]", f"{r['start_to_first_send_s']:.3f}"),
                (
                    "dispatch lag p50 / p99 / max (ms)",
                    f"{r['dispatch_lag_p50_ms']:.3f} / {r['dispatch_lag_p99_ms']:.3f} / {r['dispatch_lag_max_ms']:.3f}",
                ),
                ("share of requests with dispatch lag > 10 ms", f"{100 * r['lag_gt_10ms_share']:.2f} %"),
                ("wall time of the run (s)", f"{r['seconds']:.1f}"),
                ("load average before / after", f"{r['load_before']} / {r['load_after']}"),
            ]
            for k, v in rowsfmt:
                print(f"  {k:46s} {v}")
    finally:
        if not a.keep and os.path.exists(path):
            os.unlink(path)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
