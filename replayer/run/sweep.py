"""``replayer sweep``: the highest load a deployment holds its SLOs at. A loop over runs, outside
the daemon (DESIGN.md).

Each point is one ``replayer run`` of the same trace (or window: ``--max-requests``,
``--duration``) at the next speed-up of ``--speedups``, a child process with its own results
folder ``RESULTS/NN-speedup-X`` (its log in ``run.log`` there); the sweep reads nothing of it
but its ``summary.json`` and, for the offered load and the steady window
(``replayer.results.steady``), the due and end times and verdicts in its results files. Points
run in order and the sweep stops after the first one that did not hold
(``replayer.results.steady.judge_point``):

- ``held``: over the point's steady window (a warm-up and a cool-down left out) its attainment
  (``--goodput``'s verdict) >= ``--min-attainment`` and the server completed at least 90% of the
  rate it was offered;
- ``missed``: attainment below it (over the whole run, or over the window): the server did not
  keep up at this load;
- ``window_too_short``: the load was a burst: its steady window is shorter than the median
  E2E it would judge; ``not_sustained``: the server completed less than
  90% of the offered rate over the window (its queue grew): both say the server never carried
  this load, whatever the latencies looked like;
- ``replayer_behind``: the replayer itself fell behind (dispatch lag p99 above
  ``--max-dispatch-lag``, by default the daemon's ``BEHIND_MS``, the lag past which a run warns
  that its own CPU is the bottleneck): the point's latencies include client delay, so it says
  nothing about the server (use ``--workers``);
- ``no_verdict`` (nothing was judged), ``stopped`` (a signal, ``/stop``) or ``error`` (the run
  could not start).

Points must not share prefix-cache state, or point k would be served from point k-1's cache
(``--prefix-cache``): ``salt`` (default) gives every point fresh prefixes (the prompt seed
salted by the point's index, ``prompts.salted_seed``); ``reset`` keeps the prompts and calls
the target's ``POST /reset_prefix_cache`` (vLLM's, in dev mode; the simulator's) before each
point; ``warm`` does neither. Without ``--target`` the embedded simulator is started once and
serves every point, as one server would. Each point is a run of its own, with a run id of its own
(``--run-id R``: ``R-01``, ``R-02``...), so request ids (``X-Request-Id``) never repeat across points.

``RESULTS/sweep.json`` is rewritten after each point (a killed sweep keeps the points it ran);
``RESULTS/sweep.html`` (``report.write_sweep_report``) plots goodput, attainment, latency and
dispatch lag against the offered load. One progress line per point on stdout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pyarrow.compute as pc

from replayer.config.model import RunConfig
from replayer.observe.selfwatch import BEHIND_MS
from replayer.payload.prompts import salted_seed
from replayer.record.folder import new_results_dir, read_file
from replayer.record.recorder import write_json
from replayer.results.steady import COLUMNS, MIN_ACHIEVED_FRACTION, TRANSIENT_FRACTION, judge_point, steady_window
from replayer.results.summary import read_summary
from replayer.run.simproc import EMBEDDED_TARGET_ENV, PARENT_PID_ENV, embedded_args, spawn_sim, stop_sim

#: a sweep runs at most this many points (every load loop is bounded)
MAX_POINTS = 32
PREFIX_MODES = ("salt", "reset", "warm")
#: run settings the sweep sets per point (the rest pass through to every point's run)
PER_POINT = {"speedup", "results", "seed", "target", "resume", "resume_existing", "run_id"}
#: summary.json keys copied into each point of sweep.json (vllm bench serve's names)
POINT_KEYS = (
    "run_id",
    "scheduled",
    "sent",
    "completed",
    "failed",
    "duration",
    "request_throughput",
    "request_goodput",
    "output_token_goodput",
    "slo_attainment",
    "slo_met",
    "slo_missed",
    "slo_unknown",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
    "dispatch_lag_p50_ms",
    "dispatch_lag_p99_ms",
    "max_concurrent_requests",
    "expected_prefix_hit_tokens",
    "server_prefix_cache_hit_tokens",
)


#: ``replayer sweep``'s own settings (not RunConfig's): its flags, or these keys in its --config file
SWEEP_KEYS = frozenset({"speedups", "min_attainment", "prefix_cache", "max_dispatch_lag"})


def sweep_options(flags: dict, from_file: dict) -> dict:
    """``run_sweep``'s keyword arguments from the sweep's flags (``SWEEP_KEYS``; None: not
    given), else its ``--config`` file's (``speedups`` a list or a comma-separated string), else
    the defaults. Raises SweepError for a missing or bad value."""

    def get(key: str):
        flag = flags.get(key)
        return flag if flag is not None else from_file.get(key)

    speedups = get("speedups")
    if speedups is None:
        raise SweepError("--speedups is needed (or speedups: in the --config file), e.g. --speedups 1,2,4,8,16")
    if isinstance(speedups, list):
        speedups = ",".join(str(x) for x in speedups)
    out: dict = {"speedups": parse_speedups(str(speedups))}
    att = get("min_attainment")
    if att is not None:
        if isinstance(att, bool) or not isinstance(att, (int, float)) or not 0 <= att <= 1:
            raise SweepError(f"--min-attainment {att}: must be between 0 and 1")
        out["min_attainment"] = float(att)
    mode = get("prefix_cache")
    if mode is not None:
        if mode not in PREFIX_MODES:
            raise SweepError(f"--prefix-cache {mode!r}: must be one of {', '.join(PREFIX_MODES)}")
        out["prefix_cache"] = mode
    lag = get("max_dispatch_lag")
    if lag is not None:
        if isinstance(lag, bool) or not isinstance(lag, (int, float)) or not lag > 0:
            raise SweepError(f"--max-dispatch-lag {lag}: must be a number of ms > 0")
        out["max_dispatch_lag_ms"] = float(lag)
    return out


class SweepError(RuntimeError):
    """The sweep cannot start or go on (bad flags, a target without ``/reset_prefix_cache``)."""


def parse_speedups(text: str) -> list[float]:
    """``"1,2,4,8"`` -> ``[1.0, 2.0, 4.0, 8.0]``. Raises SweepError unless each is a number > 0,
    they increase (the load grows point by point) and there are 1 to ``MAX_POINTS`` of them."""
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SweepError(f"--speedups {text!r}: must be numbers separated by commas, e.g. 1,2,4,8,16") from None
    if not out or len(out) > MAX_POINTS:
        raise SweepError(f"--speedups {text!r}: give 1 to {MAX_POINTS} speed-ups")
    if any(not x > 0 or x == float("inf") for x in out) or any(b <= a for a, b in zip(out, out[1:])):
        raise SweepError(f"--speedups {text!r}: each must be > 0 and larger than the one before")
    return out


def point_rows(folder: str) -> dict[str, list]:
    """The columns ``replayer.results.steady.steady_window`` reads (``steady.COLUMNS``), of every
    results file of a point's folder (a ``--workers`` point's in its worker folders), as lists."""
    from replayer.results.reportdata import report_files

    cols: dict[str, list] = {c: [] for c in COLUMNS}
    for f in report_files(folder):
        t = read_file(f, list(COLUMNS))
        if t is None or not t.num_rows:
            continue
        t = t.filter(pc.is_valid(t.column("due_ns")))
        for c in COLUMNS:
            cols[c] += t.column(c).to_pylist()
    return cols


def offered_rps(due_ns: list[int]) -> float | None:
    """The load a point offered, requests/s: (n - 1) / the span of its n due times; None for
    fewer than 2 requests or a span of 0."""
    if len(due_ns) < 2 or max(due_ns) <= min(due_ns):
        return None
    return (len(due_ns) - 1) / ((max(due_ns) - min(due_ns)) / 1e9)


def reset_prefix_cache(target: str, api_key: str | None, timeout_s: float) -> None:
    """``POST {target}/reset_prefix_cache``, retried while the target does not answer (up to
    ``timeout_s``). Raises SweepError when it answers anything but 200 (vLLM serves the endpoint
    only with ``VLLM_SERVER_DEV_MODE=1``) or never answers."""
    url = target.rstrip("/") + "/reset_prefix_cache"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, data=b"", headers=headers, method="POST"), timeout=30
            ) as r:
                r.read()
                return
        except urllib.error.HTTPError as e:
            raise SweepError(
                f"--prefix-cache reset: POST {url} answered HTTP {e.code} (vLLM serves it with "
                "VLLM_SERVER_DEV_MODE=1); --prefix-cache salt needs nothing of the server"
            ) from None
        except OSError as e:
            if time.monotonic() >= deadline:
                raise SweepError(f"--prefix-cache reset: POST {url}: {e}") from None
            time.sleep(0.2)


def short_window(w: dict) -> str:
    """Why a too-short window is: what is left of the span against the median E2E."""
    e2e = (w["median_e2el_ms"] or 0) / 1e3
    return f"{max(w['window_s'], 0):.2f} s left of a {w['span_s']:.2f} s offered span, median E2E {e2e:.2f} s"


def window_text(w: dict | None) -> str:
    """A point's steady window in words: its bounds, offered and achieved rates, attainment and
    goodput (``replayer.results.steady.steady_window``'s dict; None: fewer than 2 requests)."""

    def rate(v) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    if w is None:
        return "steady window: none (fewer than 2 requests)"
    if w["too_short"]:
        return f"steady window: too short ({short_window(w)})"
    bounds = f"{w['start_s']:.2f}-{w['end_s']:.2f} s of {w['span_s']:.2f} s"
    att = w["slo_attainment"]
    return (
        f"steady window {bounds}: offered {rate(w['offered_rps'])}, achieved {rate(w['achieved_rps'])} req/s, "
        f"attainment {'n/a' if att is None else f'{att:.1%}'} ({w['met']} of {w['judged']}), "
        f"goodput {rate(w['request_goodput'])} req/s"
    )


def point_line(i: int, total: int, p: dict) -> str:
    """The progress line of point ``i`` (1-based) of ``total``: the offered load, the steady
    window (``window_text``), the whole run's latencies and the status."""

    def ms(key: str) -> str:
        v = p.get(key)
        return "n/a" if v is None else f"{v:.0f}" if v >= 10 else f"{v:.1f}"

    if p["status"] == "error":
        return f"sweep point {i}/{total}: speed-up {p['speedup']:g}x: error ({p['why']})"
    att = p.get("slo_attainment")
    offered = p.get("offered_rps")
    return (
        f"sweep point {i}/{total}: speed-up {p['speedup']:g}x, offered {'n/a' if offered is None else f'{offered:.2f}'} "
        f"req/s; {window_text(p.get('steady_window'))}; whole run: attainment "
        f"{'n/a' if att is None else f'{att:.1%}'}, "
        f"TTFT p50/p99 {ms('median_ttft_ms')}/{ms('p99_ttft_ms')} ms, "
        f"TPOT p50/p99 {ms('median_tpot_ms')}/{ms('p99_tpot_ms')} ms, E2E p50/p99 "
        f"{ms('median_e2el_ms')}/{ms('p99_e2el_ms')} ms, dispatch lag p99 {ms('dispatch_lag_p99_ms')} ms: "
        f"{p['status']}" + ("" if p["status"] == "held" else f" ({p['why']})")
    )


def point_record(
    index: int, speedup: float, folder: str, seed: int, exit_code: int, min_attainment: float, max_lag_ms: float
) -> dict:
    """One point of ``sweep.json``, from its run's folder: its settings, offered load (whole
    span), achieved rate and steady window (``replayer.results.steady``), the ``POINT_KEYS`` and
    ``slo_attainment_<bound>`` of its ``summary.json``, and its judgement (``judge_point``:
    ``status``, ``why``, ``replayer_behind``)."""
    summary = read_summary(folder) or None
    rows = point_rows(folder) if summary else {c: [] for c in COLUMNS}
    window = steady_window(*(rows[c] for c in COLUMNS))
    status, why = judge_point(summary, window, min_attainment, max_lag_ms)
    return {
        "index": index,
        "speedup": speedup,
        "results": os.path.basename(folder),
        "seed": seed,
        "exit_code": exit_code,
        "offered_rps": offered_rps(rows["due_ns"]),
        "achieved_rps": window["achieved_rps"] if window else None,
        "steady_window": window,
        **{key: (summary or {}).get(key) for key in POINT_KEYS},
        **{key: v for key, v in (summary or {}).items() if key.startswith("slo_attainment_")},
        "status": status,
        "why": why,
        "replayer_behind": status == "replayer_behind",
    }


def run_sweep(  # noqa: C901, PLR0912, PLR0915
    cfg: RunConfig,
    run_flags: list[str],
    *,
    speedups: list[float],
    min_attainment: float = 0.9,
    prefix_cache: str = "salt",
    max_dispatch_lag_ms: float = BEHIND_MS,
) -> tuple[dict, int]:
    """Run the sweep (see the module docstring); returns (sweep.json's dict, exit code: 0 when it
    ran to its end or its stop rule, 2 when a point could not start or a reset failed, 128 + the
    signal's number when SIGTERM/SIGINT/SIGHUP stopped it). ``run_flags``: every run setting
    but ``PER_POINT`` (``cli.flags_for``), passed to each point's ``replayer run``."""
    if prefix_cache not in PREFIX_MODES:
        raise SweepError(f"--prefix-cache {prefix_cache!r}: must be one of {', '.join(PREFIX_MODES)}")
    if not cfg.goodput:
        raise SweepError(
            "--goodput is needed: each point is judged by its SLO attainment "
            "(e.g. --goodput ttft:2000 tpot:50 e2el:30000)"
        )
    if cfg.run_id and len(cfg.run_id) > 61:
        raise SweepError(f"--run-id {cfg.run_id!r}: at most 61 characters in a sweep (each point adds -NN)")
    results = cfg.results or new_results_dir()
    if os.path.exists(os.path.join(results, "sweep.json")):
        raise SweepError(f"--results {results}: holds an earlier sweep (sweep.json); give another folder")
    os.makedirs(results, exist_ok=True)
    signals: list[int] = []
    child: list[subprocess.Popen] = []

    def forward(signum, frame):  # the point in progress drains (its run handles the signal), then we stop
        signals.append(signum)
        for p in child:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    sim = None
    targets = cfg.targets
    sweep: dict[str, Any] = {
        "trace": cfg.trace,
        "target": targets[0] if len(targets) == 1 else (targets or None),
        "target_embedded": not targets,
        "speedups": speedups,
        "min_attainment": min_attainment,
        "goodput_slos_ms": cfg.goodput_slos,
        "prefix_cache": prefix_cache,
        "seed": cfg.seed,
        "max_requests": cfg.max_requests,
        "duration_s": cfg.duration_s,
        "max_dispatch_lag_p99_ms": max_dispatch_lag_ms,
        "steady_rule": {
            "transient_fraction": TRANSIENT_FRACTION,
            "transient_at_least": "median_e2el",
            "min_achieved_fraction": MIN_ACHIEVED_FRACTION,
        },
        "started_wall_s": time.time(),
        "points": [],
        "highest_held_speedup": None,
        "highest_held_offered_rps": None,
        "highest_held_achieved_rps": None,
        "highest_held_request_goodput": None,
        "stop_reason": None,
    }
    code = 0
    try:
        if not targets:
            sim, embedded = spawn_sim(embedded_args(cfg.tokenizer))
            targets = [embedded]
            sweep["target"] = embedded
        for k, speedup in enumerate(speedups):
            if signals:
                break
            folder = os.path.join(results, f"{k + 1:02d}-speedup-{speedup:g}")
            os.makedirs(folder, exist_ok=True)
            seed = salted_seed(cfg.seed, k) if prefix_cache == "salt" else cfg.seed
            if prefix_cache == "reset":
                for target in targets:
                    reset_prefix_cache(target, cfg.api_key(), cfg.ready_timeout_s if cfg.target else 30.0)
            args = [
                sys.executable,
                "-m",
                "replayer",
                "run",
                *run_flags,
                "--speedup",
                repr(speedup),
                "--results",
                folder,
                "--seed",
                str(seed),
                *(a for t in targets for a in ("--target", t)),
                *(["--run-id", f"{cfg.run_id}-{k + 1:02d}"] if cfg.run_id else []),
            ]
            env = {
                **os.environ,
                PARENT_PID_ENV: str(os.getpid()),  # stops with us; prints nothing
                **({EMBEDDED_TARGET_ENV: targets[0]} if sim is not None else {}),
            }
            with open(os.path.join(folder, "run.log"), "ab") as log:
                p = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
                child[:] = [p]
                rc = p.wait()
            point = point_record(k + 1, speedup, folder, seed, rc, min_attainment, max_dispatch_lag_ms)
            status, why = point["status"], point["why"]
            sweep["points"].append(point)
            if not cfg.quiet:
                print(point_line(k + 1, len(speedups), point), flush=True)
            if status == "held":
                sweep.update(
                    highest_held_speedup=speedup,
                    highest_held_offered_rps=point["offered_rps"],
                    highest_held_achieved_rps=point["achieved_rps"],
                    highest_held_request_goodput=point["request_goodput"],
                )
            else:
                sweep["stop_reason"] = f"{why} at speed-up {speedup:g}x"
            write_json(os.path.join(results, "sweep.json"), sweep)
            if status != "held":
                code = 2 if status == "error" else 0
                break
        else:
            sweep["stop_reason"] = "every point held"
    except SweepError as e:
        sweep["stop_reason"] = str(e)
        print(f"replayer sweep: {e}", file=sys.stderr)
        code = 2
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if sim is not None:
            stop_sim(sim)
    if signals:
        sweep["stop_reason"] = f"stopped by {signal.Signals(signals[0]).name}"
        code = 128 + signals[0]
    sweep["finished_wall_s"] = time.time()
    write_json(os.path.join(results, "sweep.json"), sweep)
    from replayer.results.sweepreport import write_sweep_report

    page = write_sweep_report(sweep, os.path.join(results, "sweep.html"))
    held = sweep["highest_held_speedup"]
    print(
        "sweep: "
        + (
            f"the highest speed-up that held: {held:g}x ({sweep['highest_held_offered_rps'] or 0:.2f} req/s "
            f"offered, {sweep['highest_held_achieved_rps'] or 0:.2f} req/s achieved over its steady window, "
            f"goodput {sweep['highest_held_request_goodput'] or 0:.2f} req/s over the whole run)"
            if held is not None
            else "no speed-up held"
        )
        + f"; {sweep['stop_reason']}",
        flush=True,
    )
    print(
        f"results: {results}/ (sweep.json, {os.path.basename(page)}, {len(sweep['points'])} point folders)", flush=True
    )
    return sweep, code
