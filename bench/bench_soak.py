"""Soak memory benchmark (issue 6): does the replayer's RSS stay flat over ~1M requests?

    .venv/bin/python bench/bench_soak.py [--requests 1000000] [--max-seconds 900] [--dir /tmp]

Prints numbers, asserts nothing. Steps:

1. ``replayer trace synth``: a short-request trace (``--trace-rows`` rows, default 100,000, at
   ``--rate`` req/s; input ``const:8`` tokens, output ``uniform:1:4`` tokens, one turn per session,
   so every row has its own hash block).
2. ``replayer sim`` on a free 127.0.0.1 port with near-zero latencies (``--sim-args``), started
   here so its memory is not counted.
3. ``replayer run TRACE --target SIM --loop forever --max-requests N --speedup S --roll-rows 100000
   --admin-port P --quiet`` (``--single-pass`` instead generates an N-row trace and replays it
   once, so the prefixes never repeat). Every second this script records the RSS of the replayer
   process (psutil, the process alone: with ``--target`` it has no children) and ``sent`` /
   ``completed`` / ``in_flight`` from ``GET http://127.0.0.1:P/status``. After ``--max-seconds``
   it sends SIGTERM (the replayer drains and flushes), so the run is bounded in time.
4. Report: RSS at the first sample with >= 100k completed, at the last sample while running, the
   growth between them, the least-squares slope (MB per 100k requests) over samples past 100k,
   requests/s, total time, rows found in ``requests-*.parquet`` + ``parts/``, and the load
   average (``os.getloadavg``) at start and end. ``--samples FILE`` keeps the raw samples as CSV.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import psutil

PY = sys.executable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str, timeout: float = 2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - 127.0.0.1 only
        return json.loads(r.read())


def _load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def _rows_on_disk(results: str) -> tuple[int, int, int]:
    import pyarrow.parquet as pq

    rolled = sorted(glob.glob(os.path.join(results, "requests*.parquet")))
    parts = sorted(glob.glob(os.path.join(results, "parts", "part-*.parquet")))
    n = 0
    for f in rolled + parts:
        try:
            n += pq.ParquetFile(f).metadata.num_rows
        except Exception:  # noqa: BLE001 - a file being renamed right now
            pass
    return n, len(rolled), len(parts)


class Sampler(threading.Thread):
    """Every ``every_s``: (t, rss_mb, sent, completed, in_flight, state, sim_rss_mb)."""

    def __init__(self, proc: psutil.Process, admin: str, sim: psutil.Process | None, every_s: float = 1.0):
        super().__init__(daemon=True)
        self.proc, self.admin, self.sim, self.every_s = proc, admin, sim, every_s
        self.samples: list[tuple] = []
        self.stop_evt = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop_evt.is_set():
            t = time.monotonic() - self.t0
            try:
                rss = self.proc.memory_info().rss / 2**20
            except psutil.Error:
                break
            sim_rss = None
            if self.sim is not None:
                try:
                    sim_rss = self.sim.memory_info().rss / 2**20
                except psutil.Error:
                    pass
            try:
                st = _get_json(self.admin + "/status", timeout=self.every_s)
                row = (
                    t,
                    rss,
                    st.get("sent", 0),
                    st.get("completed", 0),
                    st.get("in_flight", 0),
                    st.get("state", "?"),
                    sim_rss,
                )
            except Exception:  # noqa: BLE001 - admin not up yet / shutting down
                row = (t, rss, None, None, None, "no-admin", sim_rss)
            self.samples.append(row)
            self.stop_evt.wait(max(0.0, self.every_s - (time.monotonic() - self.t0 - t)))


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope dy/dx."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx == 0:
        return None
    return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1_000_000, help="--max-requests of the run")
    ap.add_argument("--max-seconds", type=float, default=900.0, help="SIGTERM the replayer after this long")
    ap.add_argument("--trace-rows", type=int, default=100_000, help="rows of the looped trace")
    ap.add_argument("--single-pass", action="store_true", help="an N-row trace replayed once (no loop)")
    ap.add_argument("--rate", type=float, default=100.0, help="trace arrival rate, req/s")
    ap.add_argument("--speedup", type=float, default=8.0, help="replay speed-up (offered = rate x speedup)")
    ap.add_argument("--input-dist", default="const:8")
    ap.add_argument("--output-dist", default="uniform:1:4")
    ap.add_argument("--roll-rows", type=int, default=100_000)
    ap.add_argument(
        "--sim-args",
        default="--ttft-base-ms 1 --itl-base-ms 1 --prefill-us-per-token 0 --itl-per-running-us 0",
        help="extra flags of `replayer sim`",
    )
    ap.add_argument("--run-args", default="", help="extra flags of `replayer run`")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--keep", action="store_true", help="keep the trace and results folder")
    ap.add_argument("--samples", default=None, metavar="FILE", help="write the raw samples as CSV")
    a = ap.parse_args()

    work = os.path.join(a.dir, f"bench_soak_{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    trace = os.path.join(work, "trace.parquet")
    results = os.path.join(work, "results")
    rows = a.requests if a.single_pass else a.trace_rows
    load_start = _load()
    print(f"# start {time.strftime('%H:%M:%S')} {load_start}", flush=True)
    synth = [
        PY,
        "-m",
        "replayer",
        "trace",
        "synth",
        "-o",
        trace,
        "--rows",
        str(rows),
        "--rate",
        str(a.rate),
        "--input-dist",
        a.input_dist,
        "--output-dist",
        a.output_dist,
        "--seed",
        "7",
    ]
    print("$ " + shlex.join(synth), flush=True)
    subprocess.run(synth, check=True, stdout=subprocess.DEVNULL)

    sim_port, admin_port = _free_port(), _free_port()
    sim_cmd = [PY, "-m", "replayer", "sim", "--host", "127.0.0.1", "--port", str(sim_port), *shlex.split(a.sim_args)]
    run_cmd = [
        PY,
        "-m",
        "replayer",
        "run",
        trace,
        "--target",
        f"http://127.0.0.1:{sim_port}",
        "--speedup",
        str(a.speedup),
        "--max-requests",
        str(a.requests),
        "--roll-rows",
        str(a.roll_rows),
        "--results",
        results,
        "--admin-port",
        str(admin_port),
        "--quiet",
        "--validate-trace",
        "lazy",
        *([] if a.single_pass else ["--loop", "forever"]),
        *shlex.split(a.run_args),
    ]
    print("$ " + shlex.join(sim_cmd), flush=True)
    print("$ " + shlex.join(run_cmd), flush=True)
    sim = subprocess.Popen(
        sim_cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "sim.err"), "w")
    )
    run = None
    sampler = None
    terminated = False
    t_term = float("inf")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get_json(f"http://127.0.0.1:{sim_port}/v1/models")
                break
            except Exception:  # noqa: BLE001
                if time.monotonic() > deadline or sim.poll() is not None:
                    raise RuntimeError("sim did not start") from None
                time.sleep(0.2)
        t_start = time.monotonic()
        run = subprocess.Popen(
            run_cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(work, "run.err"), "w"),
        )
        sampler = Sampler(psutil.Process(run.pid), f"http://127.0.0.1:{admin_port}", psutil.Process(sim.pid))
        sampler.start()
        next_print = 30.0
        while run.poll() is None:
            el = time.monotonic() - t_start
            if el > a.max_seconds and not terminated:
                print(f"# {el:.0f} s: time box reached, SIGTERM to the replayer (drain + flush)", flush=True)
                run.send_signal(signal.SIGTERM)
                terminated = True
                t_term = time.monotonic() - sampler.t0
            if el >= next_print and sampler.samples:
                s = sampler.samples[-1]
                print(
                    f"# t={s[0]:6.0f}s rss {s[1]:7.1f} MB sent {s[2]} completed {s[3]} in_flight {s[4]} "
                    f"state {s[5]} sim rss {s[6] or 0:.0f} MB  {_load()}",
                    flush=True,
                )
                next_print += 30.0
            if terminated and el > a.max_seconds + 120:
                run.kill()
            time.sleep(0.5)
        total_s = time.monotonic() - t_start
        sampler.stop_evt.set()
        sampler.join(5)
    finally:
        if run is not None and run.poll() is None:
            run.kill()
        sim.terminate()
        try:
            sim.wait(10)
        except subprocess.TimeoutExpired:
            sim.kill()
    load_end = _load()

    samples = sampler.samples
    if a.samples:
        with open(a.samples, "w", encoding="utf-8") as f:
            f.write("t_s,rss_mb,sent,completed,in_flight,state,sim_rss_mb\n")
            for s in samples:
                f.write(
                    ",".join("" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x)) for x in s) + "\n"
                )
    # samples while issuing requests (before the time box's SIGTERM: the stop records the rest of the
    # current trace batch as not_started, a transient that is not steady-state memory)
    running = [s for s in samples if s[5] == "running" and s[3] is not None and s[0] < t_term - 1]
    if not running:
        print("no samples while running; see", os.path.join(work, "run.err"))
        return 1
    at100k = next((s for s in running if s[3] >= 100_000), None)
    last = running[-1]
    first_run = running[0]
    peak = max(s[1] for s in samples)
    peak_running = max(s[1] for s in running)
    max_inflight = max(s[4] for s in running)
    slope_pts = [(s[3] / 1e5, s[1]) for s in running if s[3] >= 100_000]
    slope = _slope(slope_pts)
    late_pts = [(s[3] / 1e5, s[1]) for s in running if s[3] >= 200_000]
    slope_late = _slope(late_pts)
    run_s = last[0] - first_run[0]
    rps = (last[3] - first_run[3]) / run_s if run_s > 0 else 0.0
    on_disk, n_rolled, n_parts = _rows_on_disk(results)
    summary = {}
    try:
        with open(os.path.join(results, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
    except OSError:
        pass

    print()
    print(f"replayer exit code {run.returncode}; {'stopped by the time box' if terminated else 'finished'}")
    print(f"{'metric':44s} value")
    print(f"{'requests completed (last running sample)':44s} {last[3]:,}")
    print(f"{'requests completed (summary.json)':44s} {summary.get('completed', 'n/a')}")
    print(f"{'rows on disk (rolled files + parts)':44s} {on_disk:,} in {n_rolled} rolled files, {n_parts} parts")
    print(f"{'RSS at start of running (MB)':44s} {first_run[1]:.1f} (completed {first_run[3]:,})")
    if at100k:
        print(f"{'RSS at ~100k completed (MB)':44s} {at100k[1]:.1f} (completed {at100k[3]:,}, t={at100k[0]:.0f}s)")
    print(f"{'RSS at last running sample (MB)':44s} {last[1]:.1f} (completed {last[3]:,}, t={last[0]:.0f}s)")
    if at100k:
        print(f"{'growth ~100k -> last (MB)':44s} {last[1] - at100k[1]:+.1f} over {last[3] - at100k[3]:,} requests")
    print(
        f"{'RSS slope past 100k (MB per 100k requests)':44s} "
        f"{'n/a' if slope is None else f'{slope:+.2f}'} ({len(slope_pts)} samples)"
    )
    print(
        f"{'RSS slope past 200k (MB per 100k requests)':44s} "
        f"{'n/a' if slope_late is None else f'{slope_late:+.2f}'} ({len(late_pts)} samples; after the first "
        "loop/roll and the prompt-block LRU filled)"
    )
    print(
        f"{'peak RSS while running / overall (MB)':44s} {peak_running:.1f} / {peak:.1f} (overall includes the "
        "final read_results + summary)"
    )
    print(f"{'max in-flight (sampled)':44s} {max_inflight}")
    print(f"{'requests/s (running samples)':44s} {rps:.0f} (offered {a.rate * a.speedup:.0f})")
    print(
        f"{'dispatch lag p50 / p99 (ms, summary.json)':44s} {summary.get('dispatch_lag_p50_ms')} / "
        f"{summary.get('dispatch_lag_p99_ms')}"
    )
    print(f"{'total time, process start to exit (s)':44s} {total_s:.0f}")
    print(f"{'load average start / end':44s} {load_start} / {load_end}")
    # RSS by 100k milestones
    print("\ncompleted   t_s    rss_mb  in_flight  sim_rss_mb")
    mark = 0
    for s in running:
        if s[3] >= mark:
            print(f"{s[3]:>9,} {s[0]:6.0f} {s[1]:9.1f} {s[4]:>9} {s[6] or 0:10.1f}")
            mark = (s[3] // 100_000 + 1) * 100_000
    print(f"{last[3]:>9,} {last[0]:6.0f} {last[1]:9.1f} {last[4]:>9} {last[6] or 0:10.1f}")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print("kept", work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
