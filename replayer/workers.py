"""Scale-out on one host (``--workers N``) and merging shard results (``replayer merge``).

``run_workers`` starts N ``replayer run`` processes, one shard each (``--shard i/N``), all
anchored at one wall-clock start time (``--start-at``), each writing ``RESULTS/worker-i/``; it
forwards SIGTERM/SIGINT to them, waits, and writes one merged ``RESULTS/summary.json``. With no
``--target`` it starts one embedded simulator for all of them. Each worker serves its own
``/metrics`` (``admin_port + i``; histograms, so Prometheus sums them into a merged view).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

from .config import RunConfig
from .recorder import read_results
from .summary import format_summary, summarize

log = logging.getLogger(__name__)


def merge_results(dirs: list[str], out_dir: str | None = None, *, quiet: bool = False) -> dict:
    """One summary over several results folders (shards or workers). Writes
    ``out_dir/summary.json`` when ``out_dir`` is given. Raises FileNotFoundError for a folder
    with no results."""
    import pyarrow as pa

    tables = []
    for d in dirs:
        t = read_results(d)
        if t.num_rows == 0:
            raise FileNotFoundError(f"{d}: no results files")
        tables.append(t)
    s = summarize(pa.concat_tables(tables))
    s["merged_from"] = list(dirs)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(s, f, indent=2)
    if not quiet:
        print(format_summary(s), flush=True)
    return s


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(cfg: RunConfig, argv_flags: list[str]) -> int:
    """Run ``cfg.workers`` shard processes of the same replay; returns the worst exit code.

    ``argv_flags``: the user's ``run`` flags (without --workers/--shard/--results/--start-at/
    --admin-port/--target), passed to every worker unchanged."""
    n = cfg.workers
    results = cfg.results or os.path.join("results", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(results, exist_ok=True)
    sim = None
    target = cfg.target
    if target is None:
        port = _free_port()
        sim = subprocess.Popen([sys.executable, "-m", "replayer", "sim", "--host", "127.0.0.1", "--port", str(port)],
                               stdin=subprocess.DEVNULL)
        target = f"http://127.0.0.1:{port}"
    start_at = cfg.start_at or time.time() + 3.0 + 0.5 * n  # time for every worker to load the trace
    procs = []
    for i in range(n):
        port = 0 if cfg.admin_port == 0 else cfg.admin_port + i
        args = [sys.executable, "-m", "replayer", "run", *argv_flags, "--workers", "1", "--shard", f"{i}/{n}",
                "--start-at", repr(start_at), "--results", os.path.join(results, f"worker-{i}"),
                "--admin-port", str(port), "--target", target, "--quiet"]
        procs.append(subprocess.Popen(args, stdin=subprocess.DEVNULL))

    def forward(signum, frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        codes = [p.wait() for p in procs]
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if sim is not None:
            sim.terminate()
            try:
                sim.wait(10)
            except subprocess.TimeoutExpired:
                sim.kill()
    dirs = [os.path.join(results, f"worker-{i}") for i in range(n)]
    try:
        s = merge_results(dirs, results, quiet=cfg.quiet)
        if not cfg.quiet:
            print(f"merged {n} workers: {results}/summary.json", flush=True)
        del s
    except FileNotFoundError as e:
        print(f"replayer: merge failed: {e}", file=sys.stderr)
        return 1
    return max(codes)
