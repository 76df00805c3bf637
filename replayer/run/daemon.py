"""The entry point of ``replayer run``: one replay, from its ``RunConfig`` to its exit code.

A run is four steps, each in its own module:

1. ``replayer.run.inputs.open_inputs``: what the run reads and waits for (the trace, the results
   folder, the target and its model, the metrics and the admin server), checked before anything
   is sent;
2. ``replayer.run.assemble.assemble``: the parts built from the settings and those inputs (pure);
3. ``replayer.run.lifecycle.run_parts``: the start-up steps, the send path and the tasks beside it,
   the signals, every part closed in reverse;
4. ``replayer.run.finish.finish``: the summary written and printed, the span export closed.

Flow of a request (one way, no call back into the run): trace -> schedule -> request factory ->
planner/dispatcher -> sender/client, each telling the run's one event stream
(``replayer.core.events``; ``replayer.run.fanout``) -> metrics, live state, recorder ->
summary.json.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from prometheus_client import CollectorRegistry

from replayer.config.model import RunConfig, new_run_id
from replayer.http.connection import raise_open_file_limit
from replayer.observe.lastscrape import last_scrape
from replayer.observe.logs import setup_logging, warn_short_secrets
from replayer.run.assemble import assemble
from replayer.run.finish import EXIT_ERROR_RATIO, error_ratio_problem, exit_code, finish
from replayer.run.inputs import open_inputs
from replayer.run.lifecycle import STOP_SIGNALS, run_parts
from replayer.run.live import RunState
from replayer.run.readiness import StartupError
from replayer.run.simproc import PARENT_PID_ENV

log = logging.getLogger("replayer")

__all__ = [
    "EXIT_ERROR_RATIO",
    "STOP_SIGNALS",
    "RunState",
    "StartupError",
    "error_ratio_problem",
    "main_run",
    "run_replay",
]


async def run_replay(
    cfg: RunConfig,
    *,
    registry: CollectorRegistry | None = None,
    state: RunState | None = None,
    sim: tuple | None = None,
) -> dict:
    """Run one replay as configured; returns the summary dict (also in RESULTS/summary.json).

    Raises StartupError (nothing sent) for an unreachable target; trace.TraceError for a bad trace.
    ``sim``: an embedded simulator already spawned by the caller (``simproc.spawn_sim``), used
    (and stopped) when no ``--target`` is given.
    """
    state = state or RunState()
    registry = registry or CollectorRegistry()
    cfg = cfg.model_copy(update={"run_id": cfg.run_id or new_run_id()})  # (known from the start: every series has it)
    before, after = raise_open_file_limit()
    if after != before:
        log.info("open-file limit raised from %d to %d (each request in flight holds a connection)", before, after)
    # the admin server and the embedded simulator outlive the run's own parts (closed after the summary)
    async with contextlib.AsyncExitStack() as outer:
        inputs = await open_inputs(cfg, outer, state=state, registry=registry, sim=sim)
        parts = assemble(inputs.cfg, inputs)  # (the settings as the target made them: its engine)
        ended = await run_parts(parts)
        summary = await finish(parts, ended)
        cfg = inputs.cfg  # the last scrape (a push, a linger: issue 46), before the admin server stops
        await last_scrape(inputs.admin, run_id=inputs.run_id, linger_s=cfg.metrics_linger_s, push_url=cfg.metrics_push)
        return summary


def main_run(cfg: RunConfig, sim: tuple | None = None) -> int:
    """Run with uvloop. Exit code: 0 when the replay ended by itself (or by ``/stop``), 2 on a
    startup/trace error or when no row of the trace was scheduled, 3 when more requests failed than
    ``--max-error-ratio`` allows (without it: when every request that ended failed), 4 when a
    background task crashed and stopped the run (``replayer.core.background``), 5 when results or
    ``summary.json`` could not all be written (a full disk: the summary printed counts them), 6 when
    ``--fail-unfaithful`` and the fidelity verdict is not faithful, 128 + the
    signal's number when SIGTERM (143), SIGINT (130) or SIGHUP (129: the terminal closed, or the
    ``--workers`` parent is gone) stopped it,
    its results on disk and resumable (a Kubernetes Job then retries the pod, which resumes)."""
    import uvloop

    from replayer.trace import TraceError

    # Worker threads (results writer, trace reader, scrape parser, metrics exposition) hold the
    # GIL in pure-Python stretches; a short switch interval gives it back to the loop quickly.
    sys.setswitchinterval(0.0005)
    # text or one JSON object per line (--log-format); the API key and control token are redacted
    setup_logging(
        cfg.log_format,
        cfg.log_threshold,  # (issue 47: --quiet writes no INFO line)
        secrets=(cfg.api_key(), cfg.control_token()),
        fields={"shard": cfg.shard} if cfg.shard_index[1] > 1 else None,
    )
    if not os.environ.get(PARENT_PID_ENV):  # (issue 47; a --workers parent said it once)
        warn_short_secrets(cfg.named_secrets())
    try:
        summary = uvloop.run(run_replay(cfg, sim=sim))
    except (StartupError, TraceError) as e:
        print(f"replayer: error: {e}", file=sys.stderr)
        return 2
    return exit_code(cfg, summary)
