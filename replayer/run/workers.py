"""Scale-out on one host (``--workers N``): the process supervisor.

``run_workers`` starts N ``replayer run`` processes, one shard each (``--shard i/N``), all
anchored at one wall-clock start time (``--start-at``), each writing ``RESULTS/worker-i/``; it
forwards SIGTERM/SIGINT to them, waits, and writes one merged ``RESULTS/summary.json``
(``replayer.results.merge``). The workers' own checks of the trace and settings are made first
(``replayer.run.precheck``): bad input starts nothing. With no ``--target`` it starts one embedded
simulator for all of them. Each
worker serves its own ``/metrics`` (``admin_port + i``; histograms, so Prometheus sums them into
a merged view).

The children run in their own sessions: a Ctrl-C at the terminal reaches only this parent, which
forwards it once (a terminal's SIGINT would otherwise reach every child twice, and the second one
cancels in-flight requests instead of draining them; a hang-up goes on as SIGTERM), and the
simulator is stopped only after every worker has drained. A worker whose parent is killed
(``REPLAYER_PARENT_PID``) stops by itself, as on SIGHUP.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.request

import replayer.record.lock as folder_lock
from replayer.config.model import RunConfig, new_run_id
from replayer.record.folder import earlier_run, new_results_dir, result_files
from replayer.record.recorder import write_json
from replayer.results.merge import merge_results
from replayer.run.precheck import input_problem
from replayer.run.simproc import (
    EMBEDDED_TARGET_ENV,
    PARENT_PID_ENV,
    ForwardStops,
    embedded_args,
    free_port,
    spawn_sim,
    stop_sim,
)

log = logging.getLogger(__name__)


def _wait_health(url: str, proc: subprocess.Popen, timeout_s: float) -> bool:
    """Poll ``url`` until it answers 200 (True), ``proc`` exits or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def _without_flag(flags: list[str], name: str) -> list[str]:
    """``flags`` without ``name VALUE``."""
    out, skip = [], False
    for f in flags:
        if skip:
            skip = False
        elif f == name:
            skip = True
        else:
            out.append(f)
    return out


def _exit_code(code: int) -> int:
    """A child's return code as a shell exit status (killed by signal N -> 128 + N)."""
    return 128 - code if code < 0 else code


def _distinct_free_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        p = free_port()
        if p not in ports:
            ports.append(p)
    return ports


def _statuses(ports: list[int]) -> list[dict | None]:
    """Each worker's ``GET /status`` (None where it does not answer: starting or finished)."""
    out: list[dict | None] = []
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=1) as r:
                out.append(json.loads(r.read()))
        except (OSError, ValueError):
            out.append(None)
    return out


def progress_line(statuses: list[dict | None], t_s: float, running: int) -> str:
    """One progress line over the workers' latest ``/status`` answers (None: none yet), as a
    single run's ``t=...`` line: sent/scheduled (scheduled is "?" until every worker knows its
    own: a shard's is known only at its end), in flight, ok, failed, the largest dispatch lag
    so far, and how many of the workers are still running."""
    live = [s for s in statuses if s]
    total = lambda k: sum(int(s.get(k) or 0) for s in live)  # noqa: E731
    known = len(live) == len(statuses) and all(s.get("scheduled") for s in live)
    lag = max((float(s.get("dispatch_lag_max_s") or 0.0) * 1e3 for s in live), default=0.0)
    return (
        f"t={t_s:.0f}s sent {total('sent')}/{total('scheduled') if known else '?'} "
        f"in-flight {total('in_flight')} ok {total('completed')} failed {total('failed')} "
        f"max lag {lag:.1f} ms ({running} of {len(statuses)} workers running)"
    )


def _progress(procs: list[subprocess.Popen], ports: list[int], start_at: float, every_s: float = 5.0) -> None:
    """Log a progress line every ``every_s`` from the workers' /status until all have exited
    (a worker that no longer answers counts with its last answer)."""
    last: list[dict | None] = [None] * len(ports)
    nxt = max(time.time(), start_at) + every_s
    while any(p.poll() is None for p in procs):
        time.sleep(0.1)
        if time.time() >= nxt:
            nxt += every_s
            last = [new or old for new, old in zip(_statuses(ports), last)]
            running = sum(p.poll() is None for p in procs)
            if running:
                log.info("%s", progress_line(last, time.time() - start_at, running))


def worker_shares(cfg: RunConfig, worker: int = 0) -> list[str]:
    """Flags giving worker ``worker`` of ``cfg.workers`` its share of a bound meant for the whole
    run: ``--retain-size`` (the results folder holds every worker's folder, so each keeps 1/N)
    and ``--max-concurrency`` (the cap on the run's requests in flight, split: C // N each, the
    first C % N workers one more; ``cap_problem`` refuses a cap below N)."""
    if cfg.workers <= 1:
        return []
    out = [] if cfg.retain_bytes is None else ["--retain-size", str(max(1, cfg.retain_bytes // cfg.workers))]
    if cfg.max_concurrency is not None:
        share = cfg.max_concurrency // cfg.workers + (worker < cfg.max_concurrency % cfg.workers)
        out += ["--max-concurrency", str(share)]
    return out


def cap_problem(cfg: RunConfig) -> str | None:
    """Why ``--max-concurrency`` cannot be split over ``--workers`` (a worker would get no slot)."""
    if cfg.max_concurrency is not None and cfg.max_concurrency < cfg.workers:
        return (
            f"--max-concurrency {cfg.max_concurrency} is split over the {cfg.workers} workers, so some would have "
            f"no slot: give --workers {cfg.max_concurrency} or fewer, or a cap of {cfg.workers} or more"
        )
    return None


def run_workers(cfg: RunConfig, argv_flags: list[str]) -> int:
    """Run ``cfg.workers`` shard processes of the same replay; returns the worst exit code
    (a worker killed by a signal counts as 128 + signal; 1 if no results could be merged).

    ``argv_flags``: the user's ``run`` flags (without --workers/--shard/--results/--start-at/
    --admin-port/--target), passed to every worker unchanged. With ``--resume DIR`` (a folder of
    an earlier ``--workers`` run) worker i resumes ``DIR/worker-i``."""
    from replayer.observe.logs import setup_logging, warn_short_secrets

    setup_logging(cfg.log_format, cfg.log_threshold, secrets=(cfg.api_key(), cfg.control_token()))
    warn_short_secrets(cfg.named_secrets())  # (issue 47)
    if (why := cap_problem(cfg)) is not None:  # (issue 47: N times the cap would be in flight)
        print(f"replayer run: {why}", file=sys.stderr)
        return 2
    n = cfg.workers
    flags = _without_flag(list(argv_flags), "--resume")
    if cfg.run_id is None and not cfg.resume:  # one run id for all workers' X-Request-Id headers
        flags += ["--run-id", new_run_id()]  # (a resumed worker keeps its checkpoint's)
    if cfg.admin_port and cfg.admin_port + n - 1 > 65535:
        print(f"replayer run: --admin-port {cfg.admin_port} + {n} workers exceeds 65535", file=sys.stderr)
        return 2
    # the workers' own checks, before the simulator, the folder or any worker starts
    ports = range(cfg.admin_port, cfg.admin_port + n) if cfg.admin_port else ()
    why = input_problem(cfg, ports, quiet=True)  # (each worker logs the trace's warnings itself)
    if why is not None:
        print(f"replayer: error: {why}", file=sys.stderr)
        return 2
    results = _results_folder(cfg, n)
    if results is None:
        return 2
    try:  # one writer per folder (issue 47): the workers lock their own worker-i
        folder_lock.acquire(results, "--workers")
    except folder_lock.FolderBusy as e:
        print(f"replayer run: --results {e}", file=sys.stderr)
        return 2
    try:
        return _supervise(cfg, flags, results)
    finally:
        folder_lock.release(results)


def _supervise(cfg: RunConfig, flags: list[str], results: str) -> int:
    """``run_workers`` past its checks, holding the results folder's lock: the embedded simulator,
    the workers, the stop signals forwarded, the merge."""
    n = cfg.workers
    stops = ForwardStops()
    sim = None
    codes: list[int] = []
    try:
        targets = cfg.targets
        if not targets:  # one embedded simulator for every worker, up before they start
            sim, url = spawn_sim(
                embedded_args(
                    cfg.tokenizer,
                    ttft_drift=cfg.sim_ttft_drift_ms_per_min,  # (issue 45)
                    itl_drift=cfg.sim_itl_drift_ms_per_min,
                )
            )
            targets = [url]
            log.info("no --target: starting the embedded simulator at %s", url)
            if not _wait_health(url + "/health", sim, 30.0):
                print(f"replayer run: the embedded simulator did not start at {url}", file=sys.stderr)
                return 1
        procs = stops.children  # (each worker in it as it starts: a stop reaches those started)
        ports, start_at = _start_workers(cfg, flags, results, targets, procs, embedded=sim is not None)
        if not cfg.quiet:
            log.info(
                "%d workers (shards 0/%d..%d/%d) start at %s; results in %s; their /status on 127.0.0.1:%s",
                n,
                n,
                n - 1,
                n,
                time.strftime("%H:%M:%S", time.localtime(start_at)),
                results,
                ",".join(map(str, ports)),
            )
            _progress(procs, ports, start_at)
        codes = [_exit_code(p.wait()) for p in procs]
    finally:
        _stop_left(stops.children)  # only if we got here by an exception: never leave workers behind
        stops.restore()
        if sim is not None:  # (after every worker has drained)
            stop_sim(sim)
    return _merge(cfg, results, codes)


def _results_folder(cfg: RunConfig, n: int) -> str | None:
    """The results folder (made), or None (said why) when it holds an earlier run's results."""
    results = cfg.resume or cfg.results
    if results is None:
        results = new_results_dir()
    elif not cfg.resume and not cfg.resume_existing:  # (a worker would refuse its folder only after the others started)
        taken = (results, *(os.path.join(results, f"worker-{i}") for i in range(n)))
        used = next((why for d in taken if os.path.isdir(d) and (why := earlier_run(d, resume=results))), None)
        if used:
            print(f"replayer run: --results {results}: {used}", file=sys.stderr)
            return None
    os.makedirs(results, exist_ok=True)
    return results


def _start_workers(
    cfg: RunConfig,
    flags: list[str],
    results: str,
    targets: list[str],
    procs: list[subprocess.Popen],
    *,
    embedded: bool,
) -> tuple[list[int], float]:
    """Start the workers (each appended to ``procs``), shard i in ``RESULTS/worker-i``, all
    anchored at one start time; returns their admin ports and the start time."""
    n = cfg.workers
    # time for every worker to import, load the trace and reach the target (a worker that is
    # later anchors at its own start, out of step: the merge then warns)
    start_at = cfg.start_at or time.time() + 4.0 + 0.5 * n
    # admin ports known here (--admin-port 0: free ones picked now), for the progress lines
    ports = _distinct_free_ports(n) if cfg.admin_port == 0 else [cfg.admin_port + i for i in range(n)]
    env = {
        **os.environ,
        PARENT_PID_ENV: str(os.getpid()),
        **({EMBEDDED_TARGET_ENV: targets[0]} if embedded else {}),
    }
    for i, port in enumerate(ports):
        wdir = os.path.join(results, f"worker-{i}")
        args = [
            *(sys.executable, "-m", "replayer", "run", *flags, *worker_shares(cfg, i)),
            *("--workers", "1", "--shard", f"{i}/{n}", "--start-at", repr(start_at)),
            *("--results", wdir, "--admin-port", str(port)),
            *(a for t in targets for a in ("--target", t)),
            "--quiet",  # (no live view: the parent's; the log at the parent's level, issue 47)
            *("--log-level", cfg.log_threshold),
        ]
        if cfg.resume and os.path.exists(os.path.join(wdir, "checkpoint.json")):
            args += ["--resume", wdir]
        procs.append(subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True, env=env))
    return ports, start_at


def _stop_left(procs: list[subprocess.Popen]) -> None:
    """Workers still running terminated (killed after 30 s)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def _merge(cfg: RunConfig, results: str, codes: list[int]) -> int:
    """The workers' results merged into ``RESULTS/summary.json``; the run's exit code."""
    n = cfg.workers
    dirs = [os.path.join(results, f"worker-{i}") for i in range(n)]
    if codes and all(c == 2 for c in codes):  # a bad trace or target: every worker said why
        print(f"replayer: the {n} workers could not start (exit 2; the reason is above)", file=sys.stderr)
        folder_lock.release(results)  # (its file goes: the folder may be left empty)
        for d in (results, os.path.dirname(results)) if cfg.results is None else (results,):
            try:  # (only if nothing is in it: each worker removed the folder it made)
                os.rmdir(d)
            except OSError:
                break
        return 2
    present = [d for d in dirs if result_files(d)]
    for d in sorted(set(dirs) - set(present)):
        print(f"replayer: {d} holds no results (worker failed before sending)", file=sys.stderr)
    if not present:
        print("replayer: merge failed: no worker wrote results", file=sys.stderr)
        return max([1, *codes])
    merged = merge_results(present, results, one_target=True)  # (printed with --quiet too: it is the outcome)
    print(f"merged {len(present)} of {n} workers: {results}/summary.json", flush=True)
    code = max([0 if len(present) == n else 1, *codes])
    from replayer.run.finish import (
        EXIT_ERROR_RATIO,
        EXIT_UNFAITHFUL,
        error_ratio_problem,
        nothing_measured,
        nothing_scheduled_problem,
        unfaithful_problem,
    )

    empty = nothing_scheduled_problem(merged)
    if code == 0 and empty:
        print(f"replayer: error: {empty}", file=sys.stderr)
        return 2
    problem = error_ratio_problem(merged, cfg.max_error_ratio)  # over all workers (they do not check)
    if code == 0 and problem and cfg.max_error_ratio is None:  # (issue 47: the merged summary says why)
        merged["nothing_measured"] = nothing_measured(merged)
        write_json(os.path.join(results, "summary.json"), merged)
    if code == 0 and problem:
        print(f"replayer: {problem}", file=sys.stderr)
        return EXIT_ERROR_RATIO
    unfaithful = unfaithful_problem(merged, cfg.fail_unfaithful)  # (issue 45: the merge's fidelity verdict)
    if code == 0 and unfaithful:
        print(f"replayer: {unfaithful}", file=sys.stderr)
        return EXIT_UNFAITHFUL
    return code
