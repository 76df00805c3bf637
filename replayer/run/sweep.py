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
serves every point, as one server would; the points' own checks of the trace and settings are
made before it starts (``replayer.run.precheck``), so bad input starts nothing. Each point is a run of its own, with a run id of its own
(``--run-id R``: ``R-01``, ``R-02``...), so request ids (``X-Request-Id``) never repeat across points.

``RESULTS/sweep.json`` is rewritten after each point (a killed sweep keeps the points it ran);
``RESULTS/sweep.html`` (``report.write_sweep_report``) plots goodput, attainment, latency and
dispatch lag against the offered load. One progress line per point on stdout.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from replayer.config.model import RunConfig
from replayer.observe.selfwatch import BEHIND_MS
from replayer.payload.prompts import salted_seed
from replayer.record.folder import new_results_dir
from replayer.record.recorder import write_json
from replayer.results.steady import MIN_ACHIEVED_FRACTION, TRANSIENT_FRACTION
from replayer.run.precheck import input_problem
from replayer.run.simproc import EMBEDDED_TARGET_ENV, PARENT_PID_ENV, ForwardStops, embedded_args, spawn_sim, stop_sim
from replayer.run.sweeppoint import SweepError, point_line, point_record, reset_prefix_cache, run_point

#: a sweep runs at most this many points (every load loop is bounded)
MAX_POINTS = 32
PREFIX_MODES = ("salt", "reset", "warm")
#: run settings the sweep sets per point (the rest pass through to every point's run)
PER_POINT = {"speedup", "results", "seed", "target", "resume", "resume_existing", "run_id"}


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


def run_sweep(
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
    results = _check(cfg, prefix_cache)
    os.makedirs(results, exist_ok=True)
    sweep = sweep_record(cfg, speedups, min_attainment, prefix_cache, max_dispatch_lag_ms)
    stops = ForwardStops()
    sim = None
    code = 0
    try:
        targets = cfg.targets
        if not targets:
            sim, embedded = spawn_sim(
                embedded_args(
                    cfg.tokenizer, ttft_drift=cfg.sim_ttft_drift_ms_per_min, itl_drift=cfg.sim_itl_drift_ms_per_min
                )
            )
            targets = [embedded]
            sweep["target"] = embedded
        code = _points(cfg, run_flags, sweep, results, targets, embedded=sim is not None, stops=stops)
    except SweepError as e:
        sweep["stop_reason"] = str(e)
        print(f"replayer sweep: {e}", file=sys.stderr)
        code = 2
    finally:
        stops.restore()
        if sim is not None:
            stop_sim(sim)
    if stops.signals:
        sweep["stop_reason"] = f"stopped by {signal.Signals(stops.signals[0]).name}"
        code = 128 + stops.signals[0]
    _finish(sweep, results)
    return sweep, code


def _check(cfg: RunConfig, prefix_cache: str) -> str:
    """The sweep's own checks before anything starts; its results folder."""
    if prefix_cache not in PREFIX_MODES:
        raise SweepError(f"--prefix-cache {prefix_cache!r}: must be one of {', '.join(PREFIX_MODES)}")
    if not cfg.goodput:
        raise SweepError(
            "--goodput is needed: each point is judged by its SLO attainment "
            "(e.g. --goodput ttft:2000 tpot:50 e2el:30000)"
        )
    if cfg.run_id and len(cfg.run_id) > 61:
        raise SweepError(f"--run-id {cfg.run_id!r}: at most 61 characters in a sweep (each point adds -NN)")
    why = input_problem(cfg, [cfg.admin_port])  # (the points' own checks, before the simulator starts)
    if why is not None:
        raise SweepError(why)
    results = cfg.results or new_results_dir()
    if os.path.exists(os.path.join(results, "sweep.json")):
        raise SweepError(f"--results {results}: holds an earlier sweep (sweep.json); give another folder")
    return results


def sweep_record(
    cfg: RunConfig, speedups: list[float], min_attainment: float, prefix_cache: str, max_dispatch_lag_ms: float
) -> dict[str, Any]:
    """``sweep.json`` before its first point: the sweep's settings and rule (pure)."""
    targets = cfg.targets
    return {
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


def _points(
    cfg: RunConfig,
    run_flags: list[str],
    sweep: dict[str, Any],
    results: str,
    targets: list[str],
    *,
    embedded: bool,
    stops: ForwardStops,
) -> int:
    """Run the points in order until one does not hold (or a stop signal); returns the exit code."""
    speedups, prefix_cache = sweep["speedups"], sweep["prefix_cache"]
    for k, speedup in enumerate(speedups):
        if stops.signals:
            return 0
        folder = os.path.join(results, f"{k + 1:02d}-speedup-{speedup:g}")
        os.makedirs(folder, exist_ok=True)
        seed = salted_seed(cfg.seed, k) if prefix_cache == "salt" else cfg.seed
        if prefix_cache == "reset":
            for target in targets:
                reset_prefix_cache(target, cfg.api_key(), cfg.ready_timeout_s if cfg.target else 30.0)
        args = [
            *run_flags,
            *("--speedup", repr(speedup), "--results", folder, "--seed", str(seed)),
            *(a for t in targets for a in ("--target", t)),
            *(["--run-id", f"{cfg.run_id}-{k + 1:02d}"] if cfg.run_id else []),
        ]
        env = {
            **os.environ,
            PARENT_PID_ENV: str(os.getpid()),  # stops with us; prints nothing
            **({EMBEDDED_TARGET_ENV: targets[0]} if embedded else {}),
        }
        rc = run_point(args, env, folder, stops.children)
        point = point_record(
            k + 1, speedup, folder, seed, rc, sweep["min_attainment"], sweep["max_dispatch_lag_p99_ms"]
        )
        sweep["points"].append(point)
        if not cfg.quiet:
            print(point_line(k + 1, len(speedups), point), flush=True)
        if point["status"] == "held":
            sweep.update(
                highest_held_speedup=speedup,
                highest_held_offered_rps=point["offered_rps"],
                highest_held_achieved_rps=point["achieved_rps"],
                highest_held_request_goodput=point["request_goodput"],
            )
        else:
            sweep["stop_reason"] = f"{point['why']} at speed-up {speedup:g}x"
        write_json(os.path.join(results, "sweep.json"), sweep)
        if point["status"] != "held":
            return 2 if point["status"] == "error" else 0
    sweep["stop_reason"] = "every point held"
    return 0


def _finish(sweep: dict[str, Any], results: str) -> None:
    """``sweep.json`` and ``sweep.html`` written, the sweep's outcome printed."""
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
