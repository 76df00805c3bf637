"""Soak benchmark of the *shipped* soak setup: is the replayer's memory flat and its disk bounded?

    .venv/bin/python bench/bench_soak_shipped.py [--requests 2000000] [--rate 100 --speedup 4]

Prints numbers, asserts nothing. What runs (every port on 127.0.0.1, every file in a temp dir):

1. ``replayer trace synth``: a short-request trace (``--trace-rows`` rows at ``--rate`` req/s;
   input ``const:8``, output ``uniform:1:4`` tokens), looped forever by the config file.
2. ``replayer sim`` with near-zero latencies (its own process, not counted).
3. ``replayer run --config configs/soak.yaml TRACE --target SIM --speedup S --roll-interval R
   --admin-port P --results DIR --max-requests N`` plus ``--run-args``: the shipped file's settings
   (loop forever, flush every 5 s, quiet, target-metric scraping of the simulator's ``/metrics``
   every 5 s, retention and the compact ITL form when the file sets them), rolled every
   ``--roll-interval`` seconds.
4. A real Prometheus (``/usr/bin/prometheus``, ``--prom-interval`` s, default 15 s; its TSDB in
   the temp dir) scrapes the replayer's admin ``/metrics``; without the binary this script
   scrapes it itself at that interval.
5. Every ``--control-every`` s a control round on the admin API: ``POST /pause``, 2 s later
   ``/resume``, then ``/speedup`` to 0.8x the speed-up and, a round later, back.
6. Every ``--sample-every`` s: the replayer's RSS (psutil, the process alone), ``/status``
   (``completed`` ...) and the results folder's size on disk (every file under it).

Report: RSS at the first sample past ``--warmup`` completed requests and at the last one, the
least-squares slope of RSS over completed requests after the warm-up (MB per 100k requests), the
results folder's peak size against the retention bound (``--retain-size`` of the run, when set),
rows per second, and the load average (other processes share the machine). ``--samples FILE``
writes the raw samples as CSV. The run stops by itself at ``--max-requests`` (or SIGTERM after
``--max-seconds``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import psutil

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str, *, method: str = "GET", body: dict | None = None, timeout: float = 5.0) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url,
        data=data,
        method=method,  # noqa: S310 - 127.0.0.1 only
        headers={"Content-Type": "application/json"} if data else {},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310
        return r.read()


def _du(path: str) -> int:
    """Bytes of every file under ``path`` (files vanishing meanwhile are skipped)."""
    n = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                n += os.path.getsize(os.path.join(dirpath, f))
            except OSError:
                pass
    return n


def _load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope dy/dx."""
    n = len(points)
    if n < 2:
        return None
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else None


def _size(text: str) -> int:
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    return int(float(num) * units[t[len(num) :]])


class Sampler(threading.Thread):
    """Every ``every_s``: (t_s, rss_mb, ended, state, results_bytes, status_results_bytes, in_flight)."""

    def __init__(self, proc: psutil.Process, admin: str, results: str, every_s: float) -> None:
        super().__init__(daemon=True)
        self.proc, self.admin, self.results, self.every_s = proc, admin, results, every_s
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
            try:
                st = json.loads(_http(self.admin + "/status", timeout=self.every_s))
                row = (
                    t,
                    rss,
                    st.get("completed", 0) + st.get("failed", 0),
                    st.get("state", "?"),
                    _du(self.results),
                    st.get("results_bytes"),
                    st.get("in_flight"),
                )
            except Exception:  # noqa: BLE001 - admin not up yet / shutting down
                row = (t, rss, None, "no-admin", _du(self.results), None, None)
            self.samples.append(row)
            self.stop_evt.wait(max(0.0, self.every_s - (time.monotonic() - self.t0 - t)))


class Scraper(threading.Thread):
    """Stands in for Prometheus when the binary is missing: GET /metrics every ``every_s``."""

    def __init__(self, url: str, every_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.every_s = url, every_s
        self.stop_evt = threading.Event()
        self.scrapes = 0

    def run(self) -> None:
        while not self.stop_evt.wait(self.every_s):
            try:
                _http(self.url)
                self.scrapes += 1
            except Exception:  # noqa: BLE001
                pass


class Controller(threading.Thread):
    """A control round on the admin API every ``every_s``: pause, resume, speed-up change."""

    def __init__(self, admin: str, speedup: float, every_s: float) -> None:
        super().__init__(daemon=True)
        self.admin, self.speedup, self.every_s = admin, speedup, every_s
        self.stop_evt = threading.Event()
        self.calls = 0
        self.errors = 0

    def _post(self, path: str, body: dict | None = None) -> None:
        try:
            _http(self.admin + path, method="POST", body=body)
            self.calls += 1
        except Exception:  # noqa: BLE001
            self.errors += 1

    def run(self) -> None:
        fast = False
        while not self.stop_evt.wait(self.every_s):
            self._post("/pause")
            self.stop_evt.wait(2.0)
            self._post("/resume")
            fast = not fast
            self._post("/speedup", {"speedup": self.speedup * (0.8 if fast else 1.0)})


def _start_prometheus(work: str, admin_hostport: str, every_s: float) -> tuple[subprocess.Popen, str] | None:
    if not os.access(PROMETHEUS, os.X_OK):
        return None
    port = _free_port()
    cfg = {
        "global": {"scrape_interval": f"{every_s:g}s", "evaluation_interval": f"{every_s:g}s"},
        "scrape_configs": [{"job_name": "replayer", "static_configs": [{"targets": [admin_hostport]}]}],
    }
    path = os.path.join(work, "prometheus.yml")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)  # JSON is YAML
    p = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={path}",
            f"--storage.tsdb.path={work}/tsdb",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(work, "prometheus.log"), "w"),
    )
    return p, f"http://127.0.0.1:{port}"


def _prom_scrapes(prom: str) -> str:
    try:
        q = urllib.request.quote('count_over_time(up{job="replayer"}[1d])')
        data = json.loads(_http(f"{prom}/api/v1/query?query={q}"))
        up = urllib.request.quote('up{job="replayer"}')
        last = json.loads(_http(f"{prom}/api/v1/query?query={up}"))
        return f"{data['data']['result'][0]['value'][1]} scrapes, last up={last['data']['result'][0]['value'][1]}"
    except Exception as e:  # noqa: BLE001
        return f"unknown ({type(e).__name__})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2_000_000, help="--max-requests of the run")
    ap.add_argument("--max-seconds", type=float, default=3 * 3600, help="SIGTERM the replayer after this long")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "soak.yaml"))
    ap.add_argument("--trace-rows", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=100.0, help="trace arrival rate, req/s")
    ap.add_argument("--speedup", type=float, default=4.0, help="offered = rate x speedup")
    ap.add_argument("--input-dist", default="const:8")
    ap.add_argument("--output-dist", default="uniform:1:4")
    ap.add_argument("--roll-interval", type=float, default=120.0, help="--roll-interval of the run (s)")
    ap.add_argument("--warmup", type=int, default=300_000, help="requests before the slope's samples")
    ap.add_argument("--sample-every", type=float, default=5.0)
    ap.add_argument("--prom-interval", type=float, default=15.0, help="Prometheus scrape interval (s)")
    ap.add_argument("--control-every", type=float, default=120.0, help="seconds between control rounds")
    ap.add_argument(
        "--sim-args", default="--ttft-base-ms 1 --itl-base-ms 1 --prefill-us-per-token 0 --itl-per-running-us 0"
    )
    ap.add_argument("--run-args", default="", help="extra flags of `replayer run` (win over the file)")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (trace, results, logs)")
    ap.add_argument("--samples", default=None, metavar="FILE", help="write the raw samples as CSV")
    a = ap.parse_args()

    work = tempfile.mkdtemp(prefix="bench_soak_shipped_", dir=a.dir)
    trace = os.path.join(work, "trace.parquet")
    results = os.path.join(work, "results")
    load_start = _load()
    print(f"# start {time.strftime('%Y-%m-%d %H:%M:%S')} {load_start}; work dir {work}", flush=True)
    synth = [
        PY,
        "-m",
        "replayer",
        "trace",
        "synth",
        "-o",
        trace,
        "--rows",
        str(a.trace_rows),
        "--rate",
        str(a.rate),
        "--input-dist",
        a.input_dist,
        "--output-dist",
        a.output_dist,
        "--seed",
        "7",
    ]
    subprocess.run(synth, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)

    sim_port, admin_port = _free_port(), _free_port()
    admin = f"http://127.0.0.1:{admin_port}"
    sim_cmd = [PY, "-m", "replayer", "sim", "--host", "127.0.0.1", "--port", str(sim_port), *shlex.split(a.sim_args)]
    run_cmd = [
        PY,
        "-m",
        "replayer",
        "run",
        "--config",
        a.config,
        trace,
        "--target",
        f"http://127.0.0.1:{sim_port}",
        "--speedup",
        str(a.speedup),
        "--max-requests",
        str(a.requests),
        "--roll-interval",
        str(a.roll_interval),
        "--results",
        results,
        "--admin-port",
        str(admin_port),
        "--validate-trace",
        "lazy",
        *shlex.split(a.run_args),
    ]
    print("$ " + shlex.join(sim_cmd), flush=True)
    print("$ " + shlex.join(run_cmd), flush=True)
    retain_size = None
    if "--retain-size" in run_cmd:
        retain_size = _size(run_cmd[run_cmd.index("--retain-size") + 1])
    else:
        try:
            import yaml

            with open(a.config, encoding="utf-8") as f:
                rs = (yaml.safe_load(f) or {}).get("retain_size")
            retain_size = _size(str(rs)) if rs else None
        except (OSError, ValueError, KeyError):
            pass
    sim = subprocess.Popen(
        sim_cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(work, "sim.err"), "w"),
        cwd=ROOT,
    )
    run = prom = None
    sampler = scraper = ctl = None
    terminated, t_term = False, float("inf")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _http(f"http://127.0.0.1:{sim_port}/v1/models")
                break
            except Exception:  # noqa: BLE001
                if time.monotonic() > deadline or sim.poll() is not None:
                    raise RuntimeError("sim did not start") from None
                time.sleep(0.2)
        t_start = time.monotonic()
        run = subprocess.Popen(
            run_cmd,
            stdin=subprocess.DEVNULL,
            stdout=open(os.path.join(work, "run.out"), "w"),
            stderr=open(os.path.join(work, "run.err"), "w"),
            cwd=ROOT,
        )
        sampler = Sampler(psutil.Process(run.pid), admin, results, a.sample_every)
        sampler.start()
        started = _start_prometheus(work, f"127.0.0.1:{admin_port}", a.prom_interval)
        if started:
            prom, prom_url = started
        else:
            scraper = Scraper(admin + "/metrics", a.prom_interval)
            scraper.start()
        ctl = Controller(admin, a.speedup, a.control_every)
        ctl.start()
        next_print = 60.0
        while run.poll() is None:
            el = time.monotonic() - t_start
            if el > a.max_seconds and not terminated:
                print(f"# {el:.0f} s: time box reached, SIGTERM to the replayer", flush=True)
                run.send_signal(signal.SIGTERM)
                terminated, t_term = True, time.monotonic() - sampler.t0
            if el >= next_print and sampler.samples:
                s = sampler.samples[-1]
                print(
                    f"# t={s[0]:6.0f}s rss {s[1]:7.1f} MB ended {s[2]} in_flight {s[6]} state {s[3]} results "
                    f"{s[4] / 1e6:.1f} MB  {_load()}",
                    flush=True,
                )
                next_print += 60.0
            if terminated and el > a.max_seconds + 180:
                run.kill()
            time.sleep(1.0)
        total_s = time.monotonic() - t_start
    finally:
        for th in (ctl, scraper, sampler):
            if th is not None:
                th.stop_evt.set()
        prom_line = (
            _prom_scrapes(prom_url)
            if prom is not None
            else (f"{scraper.scrapes} scrapes by this script (no prometheus binary)" if scraper else "n/a")
        )
        for p in (run, prom, sim):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
    load_end = _load()
    samples = sampler.samples
    if a.samples:
        with open(a.samples, "w", encoding="utf-8") as f:
            f.write("t_s,rss_mb,ended,state,results_bytes,status_results_bytes,in_flight\n")
            for s in samples:
                f.write(
                    ",".join("" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x)) for x in s) + "\n"
                )
    running = [s for s in samples if s[3] in ("running", "paused") and s[2] is not None and s[0] < t_term - 1]
    if not running:
        print("no samples while running; see", os.path.join(work, "run.err"))
        return 1
    first, last = running[0], running[-1]
    warm = next((s for s in running if s[2] >= a.warmup), None)
    pts = [(s[2] / 1e5, s[1]) for s in running if s[2] >= a.warmup]
    slope = _slope(pts)
    disk_peak = max(s[4] for s in samples)
    run_s = last[0] - first[0]
    summary = {}
    try:
        with open(os.path.join(results, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
    except OSError:
        pass
    deletions = 0
    try:
        with open(os.path.join(work, "run.err"), encoding="utf-8") as f:
            deletions = sum(1 for line in f if "retention" in line and "removed" in line)
    except OSError:
        pass

    print()
    print(
        f"replayer exit code {run.returncode}; {'stopped by the time box' if terminated else 'finished'}; "
        f"{total_s:.0f} s"
    )
    print(f"{'requests ended (last running sample)':46s} {last[2]:,}")
    print(f"{'completed / failed (summary.json)':46s} {summary.get('completed')} / {summary.get('failed')}")
    on_disk = (summary.get("completed") or 0) + (summary.get("failed") or 0)
    ended = max((s[2] for s in samples if s[2] is not None), default=0)
    print(
        f"{'results missing (ended - completed - failed)':46s} {ended - on_disk:,}"
        + (" (RESULTS LOST)" if ended > on_disk else "")
    )
    blind = sum(1 for s in samples[1:] if s[3] == "no-admin")
    print(f"{'samples with the admin port not answering':46s} {blind} of {len(samples)}")
    print(
        f"{'requests/s (running samples)':46s} {(last[2] - first[2]) / run_s if run_s else 0:.0f} "
        f"(offered {a.rate * a.speedup:.0f}, 0.8x in every other control round)"
    )
    if warm:
        print(f"{'RSS at warm-up end (MB)':46s} {warm[1]:.1f} (ended {warm[2]:,}, t={warm[0]:.0f}s)")
    print(f"{'RSS at last running sample (MB)':46s} {last[1]:.1f} (ended {last[2]:,}, t={last[0]:.0f}s)")
    print(
        f"{'RSS min / max after warm-up (MB)':46s} "
        + (f"{min(p[1] for p in pts):.1f} / {max(p[1] for p in pts):.1f}" if pts else "n/a")
    )
    print(
        f"{'RSS slope after warm-up (MB per 100k requests)':46s} "
        f"{'n/a' if slope is None else f'{slope:+.3f}'} ({len(pts)} samples past {a.warmup:,})"
    )
    # The in-flight high-water mark holds memory after a backlog clears (connections, tasks and
    # buffers stay in the allocator): the slope past the last backlog shows what grows with requests.
    flights_all = [s[6] for s in running if s[2] >= a.warmup and s[6] is not None]
    if flights_all:
        limit = max(1000, 20 * sorted(flights_all)[len(flights_all) // 2])
        backlog = [s for s in running if s[2] >= a.warmup and s[3] == "running" and s[6] is not None and s[6] > limit]
        after = [(s[2] / 1e5, s[1]) for s in running if s[2] >= a.warmup and (not backlog or s[0] > backlog[-1][0])]
        since = f"after the last backlog (in flight > {limit:,} at {backlog[-1][2]:,})" if backlog else "(no backlog)"
        tail_slope = _slope(after) if len(after) >= 20 else None
        print(
            f"{'RSS slope past the last backlog (MB per 100k)':46s} "
            f"{'n/a' if tail_slope is None else f'{tail_slope:+.3f}'} ({len(after)} samples {since})"
        )
    print(f"{'results folder peak / last (MB)':46s} {disk_peak / 1e6:.1f} / {samples[-1][4] / 1e6:.1f}")
    print(
        f"{'retention bound (--retain-size)':46s} "
        + (
            f"{retain_size / 1e6:.1f} MB: peak {'within' if disk_peak <= retain_size else 'ABOVE'} it"
            + (
                ""
                if disk_peak <= retain_size
                else f" by {(disk_peak - retain_size) / 1e6:.2f} MB (retention runs "
                "after each flush: the parts of one flush interval can sit above the bound)"
            )
            if retain_size
            else "none set"
        )
    )
    print(f"{'retention deletions logged':46s} {deletions}")
    flights = [s[6] for s in running if s[2] >= a.warmup and s[6] is not None]
    print(
        f"{'in flight after warm-up: median / max':46s} "
        + (f"{sorted(flights)[len(flights) // 2]} / {max(flights)}" if flights else "n/a")
        + " (a high max: the machine fell behind, and RSS holds those requests)"
    )
    print(f"{'admin /metrics scrapes':46s} {prom_line}")
    print(f"{'control calls (errors)':46s} {ctl.calls} ({ctl.errors})")
    print(
        f"{'dispatch lag p50 / p99 (ms, summary.json)':46s} {summary.get('dispatch_lag_p50_ms')} / "
        f"{summary.get('dispatch_lag_p99_ms')}"
    )
    print(f"{'TTFT p50 / p99 (ms, summary.json)':46s} {summary.get('median_ttft_ms')} / {summary.get('p99_ttft_ms')}")
    print(f"{'load average start / end':46s} {load_start} / {load_end}")
    print("\n  ended     t_s    rss_mb  results_mb")
    mark = 0
    for s in running:
        if s[2] >= mark:
            print(f"{s[2]:>9,} {s[0]:6.0f} {s[1]:9.1f} {s[4] / 1e6:10.1f}")
            mark = (s[2] // 100_000 + 1) * 100_000
    print(f"{last[2]:>9,} {last[0]:6.0f} {last[1]:9.1f} {last[4] / 1e6:10.1f}")
    if a.keep:
        print("kept", work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
