"""The end of a run (``finish``): ``summary.json`` assembled (the results folder's summary, the
target's metric deltas, the run's identity and settings, per-tenant and per-target sections),
the OpenTelemetry export closed (its run span carries the summary), a fleet shard's summary sent
to its coordinator, the summary printed; and the run's exit code (``exit_code``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from replayer.config.model import RunConfig
from replayer.core.background import EXIT_TASK_FAILED
from replayer.observe.target_metrics import TargetScraper, TargetScrapers
from replayer.observe.target_samples import SampleFiles
from replayer.plan.schedule import IdleGapCap
from replayer.record.folder import result_files
from replayer.record.recorder import write_json
from replayer.record.rolling import EXIT_WRITE_FAILED
from replayer.results.drift import drift_lines
from replayer.results.fidelity import FidelityBounds, fidelity_lines
from replayer.results.summary import format_summary, summarize_files
from replayer.results.targets import format_targets, read_targets
from replayer.results.tenants import format_tenants, read_tenant_sections
from replayer.results.verdicts import verdict_sections
from replayer.run.resume import scraper_totals
from replayer.run.simproc import EMBEDDED_TARGET_ENV, PARENT_PID_ENV

if TYPE_CHECKING:
    from replayer.http.client import Client
    from replayer.run.assemble import Parts
    from replayer.run.lifecycle import Ended

log = logging.getLogger(__name__)


async def finish(parts: Parts, ended: Ended) -> dict[str, Any]:
    """The run's summary (written, printed) once every part is closed; returns it."""
    cfg, inputs = parts.cfg, parts.inputs
    targets, results_dir = inputs.targets, inputs.results_dir
    if ended.recorder.rows_added == 0 and not cfg.resume:
        log.warning(
            "no row of the trace %s: nothing was sent; an empty results file keeps the folder mergeable",
            f"falls in shard {cfg.shard}" if cfg.shard_index[1] > 1 else "was scheduled",
        )
    summary = await final_summary(
        cfg,
        results_dir,
        target=targets[0] if len(targets) == 1 else targets,
        model=inputs.model,
        run_id=inputs.run_id,
        scraper=ended.scraper,
        samples=ended.samples,
        speedup_changes=ended.control.speedup_changes,
        stopped_early=ended.dispatcher.stopping,
        stop_signal=ended.stop_signal,
        gap_cap=parts.gap_cap,
        task_failures=ended.beside.background.failures,
        held=ended.recorder.unwritten_table(),
        roll_error=ended.recorder.roll_error,
        fleet=inputs.state.fleet,
        tls=_tls_counts(ended.clients),
    )
    loop = asyncio.get_running_loop()
    summary["events"] = inputs.metrics.events.as_list()  # (issue 46: what happened when)
    parts.verdicts.final(summary)  # (issue 45) the live verdicts' gauges say the summary's
    if (at_once := parts.checks.report()) is not None:  # (issue 47: streams that came all at once)
        summary["buffered_streams"] = at_once
    await loop.run_in_executor(None, rewrite_summary, results_dir, summary)
    if ended.spans is not None:  # the run span (with the summary's numbers), the queue drained, time-boxed
        try:
            summary["otel"] = await loop.run_in_executor(None, ended.spans.close, summary)
        except Exception as e:  # (tracing never costs the run its exit code)
            log.exception("OpenTelemetry: closing the span export failed")
            summary["otel"] = {"error": f"{type(e).__name__}: {e}"}
        await loop.run_in_executor(None, rewrite_summary, results_dir, summary)
    heartbeat = ended.beside.heartbeat
    if heartbeat is not None:
        await heartbeat.ended(summary)
        await heartbeat.close()
    print_summary(summary, results_dir)
    return summary


def _tls_counts(clients: dict[str, Client]) -> dict[str, Any] | None:
    """The TLS handshakes of the run's pools (resumed, sealed by the replayer, by version), the
    requests the launcher and the loop wrote; None without TLS."""
    pools = [c.pool for c in clients.values() if c.pool.tls]
    if not pools:
        return None
    versions: dict[str, int] = {}
    for p in pools:
        for v, n in p.tls_versions.items():
            versions[v] = versions.get(v, 0) + n
    return {
        "handshakes": sum(p.tls_handshakes for p in pools),
        "resumed": sum(p.tls_resumed for p in pools),
        "sealed": sum(p.tls_sealed for p in pools),
        "versions": versions,
        # (issue 48) requests written by the launcher (sealed here) and by the loop
        "requests_sealed": sum(p.tls_requests_sealed for p in pools),
        "requests_loop": sum(p.tls_requests_loop for p in pools),
        "unmatched": sum(p.tls_unmatched for p in pools),
        "key_updates": sum(p.tls_key_updates for p in pools),
    }


def exit_code(cfg: RunConfig, summary: dict[str, Any]) -> int:
    """The run's exit code from its summary (``daemon.main_run`` lists them), why on stderr."""
    sig = summary.get("stop_signal")
    if sig:
        return 128 + signal.Signals[sig].value
    unwritten = writes_failed(summary)
    if unwritten:
        print(f"replayer: {unwritten}: exit {EXIT_WRITE_FAILED}", file=sys.stderr)
        return EXIT_WRITE_FAILED
    one = cfg.shard_index[1] == 1  # (a shard of several may be empty)
    empty = nothing_scheduled_problem(summary) if one else None
    if empty:
        print(f"replayer: error: {empty}", file=sys.stderr)
        return 2
    failed = summary.get("task_failures")
    if failed:
        print(
            f"replayer: a background task failed ({failed[0]['task']}: {failed[0]['error']}): the run stopped "
            f"early, its results are on disk: exit {EXIT_TASK_FAILED}",
            file=sys.stderr,
        )
        return EXIT_TASK_FAILED
    problem = error_ratio_problem(summary, cfg.max_error_ratio) if one or cfg.max_error_ratio is not None else None
    if problem:
        print(f"replayer: {problem}", file=sys.stderr)
        return EXIT_ERROR_RATIO
    # (issue 45) a --workers worker leaves it to its parent, which judges the merge
    unfaithful = unfaithful_problem(summary, cfg.fail_unfaithful and not os.environ.get(PARENT_PID_ENV))
    if unfaithful:
        print(f"replayer: {unfaithful}", file=sys.stderr)
        return EXIT_UNFAITHFUL
    return 0


async def final_summary(
    cfg: RunConfig,
    results_dir: str,
    *,
    target: str | list[str],
    model: str,
    run_id: str,
    scraper: TargetScraper | TargetScrapers | None,
    samples: SampleFiles | None,
    speedup_changes: list[dict],
    stopped_early: bool,
    stop_signal: str | None,
    gap_cap: IdleGapCap | None,
    task_failures: list[dict[str, str]] | None = None,
    held: pa.Table | None = None,
    roll_error: str | None = None,
    fleet: dict[str, Any] | None = None,
    tls: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Summarize the results folder (off the loop), add the run's own parts and write
    ``summary.json``; returns it. ``task_failures``: the background tasks that crashed
    (``replayer.core.background``), in the summary only when there were some. ``held``: the
    results a failed write (a full disk) kept in memory: counted (``results_not_written``).
    ``roll_error``: why the last roll failed (its parts stay). ``tls``: the TLS handshakes, how
    many resumed a session, how many had their records sealed by the replayer, by version (an
    ``https://`` target). When ``summary.json`` cannot be
    written, the summary says so (``summary_not_written``) and is only printed."""
    loop = asyncio.get_running_loop()
    summary = await loop.run_in_executor(
        None, functools.partial(summarize_files, result_files(results_dir), slos=cfg.goodput_slos, held=held)
    )
    if samples is not None and scraper is not None:  # (also the parts a killed earlier run left)
        await loop.run_in_executor(None, _roll_samples, samples, scraper, results_dir)
    if isinstance(scraper, TargetScrapers):  # several targets: each one's deltas in its section
        pass
    elif scraper is not None and scraper.scrapes:
        summary["target_metrics"] = {
            "engine": scraper.dialect.name,  # (issue 49: what it does not export is null, never 0)
            "unknown": scraper.unknown,
            "deltas": {**scraper.unknown_nulls("counter"), **scraper.deltas()},
            "latest": {**scraper.unknown_nulls("gauge"), **scraper.latest},
            "first_scrape_s": scraper.first_time_s,
            "last_scrape_s": scraper.last_time_s,
            "missing": scraper.missing,
            **scraper_totals(scraper),
        }
        hits = summary["target_metrics"]["deltas"].get("prefix_cache_hits")
        if hits is not None or "prefix_cache_hits" in scraper.unknown:
            summary["server_prefix_cache_hit_tokens"] = hits
        mm_hits = summary["target_metrics"]["deltas"].get("mm_cache_hits")
        if mm_hits is not None and "images_sent" in summary:
            summary["server_image_cache_hits"] = int(mm_hits) if float(mm_hits).is_integer() else mm_hits
    elif scraper is not None:
        summary["target_metrics"] = {"scrapes": 0, "scrape_errors": scraper.errors, "last_error": scraper.last_error}
    summary.update(
        {
            "target": target,
            "engine": cfg.engine,
            "target_embedded": _target_embedded(cfg),
            "model": model,
            "trace": cfg.trace,
            "synthetic_load": cfg.synthetic_load(),
            "speedup": cfg.speedup,
            "speedup_changes": speedup_changes,
            "shard": cfg.shard,
            "loop": cfg.loop,
            "results": results_dir,
            "run_id": run_id,
            "stopped_early": stopped_early,
            "stop_signal": stop_signal,
        }
    )
    _pace_sections(summary, cfg)
    _add_run_notes(summary, cfg, task_failures, fleet)
    if gap_cap is not None:  # --idle-gap-cap: gaps capped, time skipped, the trace -> replay map
        summary["idle_gap_cap"] = gap_cap.report()
    if cfg.mix:  # per-tenant sections (replayer.results.tenants)
        summary["mix"] = list(cfg.mix)
        summary["tenants"] = await loop.run_in_executor(None, read_tenant_sections, results_dir)
    if isinstance(target, list):  # several targets: per-target sections (replayer.results.targets)
        summary["target_policy"] = cfg.target_policy
        summary["targets"], summary["target_switches"] = await loop.run_in_executor(None, read_targets, results_dir)
        if isinstance(scraper, TargetScrapers):
            metrics = scraper.sections()
            for url, sec in metrics.items():
                summary["targets"].setdefault(url, {})["target_metrics"] = sec
            hits = [sec.get("deltas", {}).get("prefix_cache_hits") for sec in metrics.values()]
            if hits and all(h is not None for h in hits):  # (every target reported it)
                summary["server_prefix_cache_hit_tokens"] = sum(hits)
    if roll_error is not None:
        summary["results_roll_error"] = roll_error
    if tls is not None:
        summary["tls"] = tls
    # wiring (issue 45): the fidelity and drift verdicts, from the results files
    summary.update(await loop.run_in_executor(None, functools.partial(_verdicts, cfg, results_dir, summary)))
    write_summary(summary, results_dir)
    return summary


def _verdicts(cfg: RunConfig, results_dir: str, summary: dict[str, Any]) -> dict[str, Any]:
    """The ``fidelity`` and ``drift`` sections (``replayer.results.verdicts``), or an ``error``
    in each when they cannot be computed (the run keeps its summary and its exit code)."""
    try:
        return verdict_sections(
            [results_dir],
            summary,
            bounds=FidelityBounds(max_lag_ms=cfg.fidelity_max_lag_ms),
            max_concurrency=cfg.max_concurrency,
            window_s=cfg.drift_window_s,
            min_change_pct=cfg.drift_min_change_pct,
            reference=cfg.drift_reference,
        )
    except Exception as e:  # (a verdict never costs the run its summary)
        log.exception("the fidelity and drift verdicts failed")
        return {k: {"verdict": "not_judged", "error": f"{type(e).__name__}: {e}"} for k in ("fidelity", "drift")}


def _roll_samples(samples: SampleFiles, scraper: TargetScraper | TargetScrapers, results_dir: str) -> None:
    """The target-metric samples rolled into their file (a full disk: the parts stay, logged)."""
    try:
        samples.roll(scraper.take_samples())
    except OSError as e:
        log.error("cannot roll the target-metric samples in %s: %s", results_dir, e)


def write_summary(summary: dict[str, Any], results_dir: str) -> None:
    """Write ``summary.json``; when it cannot be (a full disk, an I/O error) the summary says
    so (``summary_not_written``: it is printed only, and the exit code says so)."""
    path = os.path.join(results_dir, "summary.json")
    try:
        write_json(path, summary)
    except OSError as e:
        summary["summary_not_written"] = f"{e.strerror or e}"
        log.error("cannot write %s: %s; the summary is printed only", path, e)


def _add_run_notes(
    summary: dict[str, Any], cfg: RunConfig, task_failures: list[dict[str, str]] | None, fleet: dict[str, Any] | None
) -> None:
    """The sections a run has only sometimes: crashed background tasks, a fleet shard's start and
    clock, an unverified TLS target."""
    if task_failures:
        summary["task_failures"] = list(task_failures)
    if fleet is not None:  # a fleet shard: its start, its clock against the coordinator's
        summary["fleet"] = fleet
    if cfg.insecure and any(u.startswith("https://") for u in cfg.targets):
        summary["tls_insecure"] = True
    if cfg.max_error_ratio is None and cfg.shard_index[1] == 1 and (why := nothing_measured(summary)):
        summary["nothing_measured"] = (
            why  # (issue 47: the run exits 3)  # --insecure: the target's certificate was not verified
        )


def _pace_sections(summary: dict[str, Any], cfg: RunConfig) -> None:
    """The ``--max-concurrency`` cap and the warm-up's rule, beside what the results say of them
    (``fold.SummaryFold``: the queue waits, the warm-up's counts)."""
    if cfg.max_concurrency is not None:
        summary["concurrency_cap"] = {"max_concurrency": cfg.max_concurrency, **summary.get("concurrency_cap", {})}
    if cfg.warmup_requests or cfg.warmup_seconds_s:
        summary["warmup"] = {**warmup_rule(cfg.warmup_requests, cfg.warmup_seconds_s), **summary.get("warmup", {})}


def warmup_rule(requests: int, seconds: float) -> dict[str, Any]:
    """The warm-up's settings and its boundary, as summary.json states them."""
    return {
        "warmup_requests": requests,
        "warmup_seconds": seconds,
        "boundary": "by each request's own send time: the first --warmup-requests requests sent (per process) "
        "and those sent less than --warmup-seconds after the run's start are warm-up, left out of every "
        "statistic, throughput and the verdict",
        "requests": 0,
    }


def rewrite_summary(results_dir: str, summary: dict[str, Any]) -> None:
    """``summary.json`` again, with the sections known after ``final_summary`` (``otel``, ``events``)."""
    write_summary(summary, results_dir)


def print_summary(summary: dict[str, Any], results_dir: str) -> None:
    """The summary as printed at the end of a run (not by a ``--workers`` worker: its parent
    prints the merge)."""
    if os.environ.get(PARENT_PID_ENV):
        return
    print(format_summary(summary), flush=True)
    if summary.get("tenants"):
        print(format_tenants(summary["tenants"]), flush=True)
    if summary.get("targets"):
        print(format_targets(summary["targets"], summary.get("target_switches", 0)), flush=True)
    if summary.get("idle_gap_cap"):
        g = summary["idle_gap_cap"]
        print(
            f"Idle gaps over {g['cap_s']:g} s (replay time) capped: {g['gaps_capped']}, "
            f"{g['time_skipped_s']:,.3f} s skipped",
            flush=True,
        )
    for line in fidelity_lines(summary.get("fidelity")) + drift_lines(summary.get("drift")):  # (issue 45)
        print(line, flush=True)
    files = [os.path.relpath(f, results_dir) for f in result_files(results_dir)]
    listed = ", ".join(files) if len(files) <= 3 else f"{len(files)} results files"
    unwritten = writes_failed(summary)
    if summary.get("summary_not_written") is None:
        listed += ", summary.json"
    print(f"results: {results_dir}/ ({listed or 'no results file'})", flush=True)
    if unwritten:
        print(f"results not all written: {unwritten}", flush=True)


def writes_failed(summary: dict) -> str | None:
    """What of the run could not be written (the run then exits ``EXIT_WRITE_FAILED``: the
    results held in memory are counted in the summary printed; ``--resume`` on a disk with room
    completes the run), in words; None when all was."""
    said = []
    if summary.get("results_not_written"):
        folder = summary.get("results")
        again = (
            "--resume on a disk with room sends them again"
            if not folder or os.path.exists(os.path.join(folder, "checkpoint.json"))
            else "no checkpoint.json in the folder: run again on a disk with room"
        )
        said.append(
            f"{summary['results_not_written']} results held in memory and counted above are not on disk ({again})"
        )
    if summary.get("summary_not_written") is not None:
        said.append(f"summary.json not written ({summary['summary_not_written']}): the summary above is printed only")
    return "; ".join(said) or None


def _target_embedded(cfg: RunConfig) -> bool:
    """Whether the run's target is the embedded simulator: started by this run (no ``--target``)
    or by the ``--workers`` parent, which names it in ``EMBEDDED_TARGET_ENV``."""
    return cfg.target is None or cfg.target == [os.environ.get(EMBEDDED_TARGET_ENV)]


__all__ = [
    "EXIT_ERROR_RATIO",
    "EXIT_UNFAITHFUL",
    "EXIT_WRITE_FAILED",
    "exit_code",
    "final_summary",
    "finish",
    "print_summary",
    "write_summary",
    "writes_failed",
]

#: exit code of a run whose failed requests exceeded ``--max-error-ratio``
EXIT_ERROR_RATIO = 3
#: exit code of a run judged not faithful under ``--fail-unfaithful`` (``summary.json``'s ``fidelity``)
EXIT_UNFAITHFUL = 6


def unfaithful_problem(summary: dict, fail_unfaithful: bool) -> str | None:
    """Why the run should exit ``EXIT_UNFAITHFUL``: ``--fail-unfaithful`` and a fidelity verdict
    of ``not_faithful`` (its reasons); else None."""
    sec = summary.get("fidelity") or {}
    if not fail_unfaithful or sec.get("verdict") != "not_faithful":
        return None
    return f"the replay was not faithful to the trace ({'; '.join(sec.get('reasons', []))}): exit {EXIT_UNFAITHFUL}"


def nothing_scheduled_problem(summary: dict) -> str | None:
    """Why a run that scheduled no request at all should exit 2 (a trace error): every row of the
    trace was left out (a capture's failed requests, ``--max-requests``/``--duration`` windows);
    None when something was scheduled or the run was stopped before it could be."""
    if summary.get("scheduled") or summary.get("stopped_early") or summary.get("stop_signal"):
        return None
    return (
        f"no row of the trace {summary.get('trace') or ''} could be scheduled (none replayable, or none in "
        "the window asked for; `replayer trace inspect` counts them): nothing was sent: exit 2"
    )


def nothing_measured(summary: dict) -> str | None:
    """Why a run measured nothing (every request that ended failed), or None: such a run is not a
    success even without ``--max-error-ratio`` (a CI job that forgot the flag against a dead
    server). In ``summary.json`` as ``nothing_measured``."""
    failed, completed = summary.get("failed") or 0, summary.get("completed") or 0
    if not failed or completed:
        return None
    kinds = ", ".join(f"{k} {n}" for k, n in sorted((summary.get("errors_by_kind") or {}).items()))
    return (
        f"all {failed} requests that ended failed{' (' + kinds + ')' if kinds else ''}: the run measured nothing "
        f"(--max-error-ratio 1 lets such a run pass)"
    )


def error_ratio_problem(summary: dict, max_error_ratio: float | None) -> str | None:
    """Why the run should exit ``EXIT_ERROR_RATIO``: failed / (completed + failed) is above
    ``max_error_ratio``, or (no ``max_error_ratio``) every request that ended failed
    (``nothing_measured``); else None (also when no request ended)."""
    failed, ended = summary.get("failed") or 0, (summary.get("completed") or 0) + (summary.get("failed") or 0)
    if max_error_ratio is None:
        why = nothing_measured(summary)
        return f"{why}: exit {EXIT_ERROR_RATIO}" if why else None
    if not ended or failed / ended <= max_error_ratio:
        return None
    kinds = ", ".join(f"{k} {n}" for k, n in sorted((summary.get("errors_by_kind") or {}).items()))
    return (
        f"{failed} of {ended} requests failed ({failed / ended:.1%}{'; ' + kinds if kinds else ''}), "
        f"more than --max-error-ratio {max_error_ratio:g}: exit {EXIT_ERROR_RATIO}"
    )
